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


def test_emission_offsets_move_token_spans_inside_the_audio_in_order_without_overlap():
    from speechdata.alignment.forced import shifted_token_spans_ms

    spans = [(0, 1), (1, 2), (5, 7), (24, 25)]
    assert shifted_token_spans_ms(spans, 40, 1000) == [(0, 40), (40, 80), (200, 280), (960, 1000)]
    shifted = shifted_token_spans_ms(spans, 40, 1000, (130, 160))
    # Starts move by 130 ms; ends by 160 ms but never past the next token's start nor the audio's end.
    assert shifted == [(130, 170), (170, 240), (330, 440), (1000, 1000)]
    assert all(a[1] <= b[0] for a, b in zip(shifted, shifted[1:]))
    early = shifted_token_spans_ms(spans, 40, 1000, (-100, -100))
    assert early[0] == (0, 0) and all(start <= end for start, end in early)
