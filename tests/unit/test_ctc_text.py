from speechdata.alignment.transcript_units import CharVocabulary, ctc_targets, normalize_word


def test_normalization_lowercases_unifies_apostrophes_and_applies_nfkc():
    assert normalize_word("Don\u2019t") == "don't"
    assert normalize_word("ﬁne") == "fine"  # NFKC ligature


def test_char_targets_keep_one_entry_per_word_with_separators_between():
    vocab = CharVocabulary(list(" abc'"))
    targets = ctc_targets("Ab - c", vocab)
    assert targets.words == ["Ab", "-", "c"]
    assert targets.targets == [1, 2, 0, 3]  # a b <space> c; the dash normalizes to nothing
    assert targets.word_target_ranges == [(0, 2), (2, 2), (3, 4)]
    assert targets.token_texts == ["a", "b", "<space>", "c"]
    assert vocab.blank_id == 5


def test_text_outside_the_vocabulary_gives_no_targets():
    # Romanized (uroman: "riben"), but the vocabulary spells none of those letters either.
    assert ctc_targets("日本", CharVocabulary(list(" xyz"))).targets == []
    assert ctc_targets("", CharVocabulary(list(" abc"))).words == []
