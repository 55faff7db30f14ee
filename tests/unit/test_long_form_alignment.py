"""Long recordings in bounded memory (the checkpointed Viterbi gives the whole-matrix path, state for
state) and the wildcard that absorbs stretches the transcript does not cover."""

import numpy as np
import pytest

from speechdata.alignment.forced import (
    AlignmentRejected,
    WildcardSettings,
    align_transcript,
    wildcard_positions,
)
from speechdata.alignment.long_form import (
    checkpoint_frames_for,
    checkpointed_memory_bytes,
    ctc_viterbi_checkpointed,
    wildcard_stretches,
)
from speechdata.alignment.transcript_units import CharVocabulary, CtcTargets
from speechdata.alignment.viterbi import AlignmentImpossible, ctc_viterbi

VOCABULARY = CharVocabulary(list(" abcdefghijklmnopqrstuvwxyz'"))
FRAME_MS = 80
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "and",
    "then",
    "runs",
    "far",
    "away",
    "into",
    "the",
    "green",
    "woods",
]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float32)
    return (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)


def spoken(words, seed=0, music_after=None, music_frames=0):
    """Synthetic log-probs with a known path: per word a pause of blanks (the separator inside it),
    then each character for 2 to 4 frames. ``music_after``: index of the word after which
    ``music_frames`` frames of 'music' follow, where the model's best label is a random character
    (the transcript's own letters included) and the blank is unlikely.
    Returns the log-probs and each word's ``(first, last_exclusive)`` frame."""
    rng = np.random.default_rng(seed)
    labels: list[int] = []
    spans = []
    for i, word in enumerate(words):
        pause = int(rng.integers(3, 7))
        labels += [VOCABULARY.blank_id] * pause
        if i:
            labels[-2] = VOCABULARY.separator_id
        first = len(labels)
        for k, char in enumerate(word):
            if k and word[k - 1] == char:
                labels.append(VOCABULARY.blank_id)
            labels += [VOCABULARY.index[char]] * int(rng.integers(2, 5))
        spans.append((first, len(labels)))
        if i == music_after:
            labels += [-1] * music_frames
    labels += [VOCABULARY.blank_id] * 4
    logits = rng.normal(0.0, 1.0, (len(labels), VOCABULARY.blank_id + 1))
    for t, label in enumerate(labels):
        if label >= 0:
            logits[t, label] += 7.0
        else:
            logits[t, int(rng.integers(1, VOCABULARY.blank_id))] += 3.0
            logits[t, VOCABULARY.blank_id] -= 3.0
    return log_softmax(logits), spans


def word_frames(result):
    return [(w.start_ms // FRAME_MS, w.end_ms // FRAME_MS) for w in result.words]


def align(log_probs, words, **kwargs):
    return align_transcript(log_probs, " ".join(words), VOCABULARY, FRAME_MS, log_probs.shape[0] * FRAME_MS, **kwargs)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_checkpointed_path_is_the_whole_matrix_path_state_for_state(backend):
    rng = np.random.default_rng(7)
    for case in range(60):
        frames, vocab, length = int(rng.integers(1, 90)), int(rng.integers(2, 7)), int(rng.integers(0, 30))
        logits = rng.standard_normal((frames, vocab))
        if case % 3 == 0:  # quarter-rounded log-probs: many exact ties, which break the same way
            logits = np.round(logits * 4) / 4
        log_probs = logits.astype(np.float32)
        targets = rng.integers(0, vocab - 1, length)
        try:
            whole = ctc_viterbi(log_probs, targets, vocab - 1)
        except AlignmentImpossible as impossible:
            for interval in (1, 5):
                with pytest.raises(AlignmentImpossible) as raised:
                    ctc_viterbi_checkpointed(log_probs, targets, vocab - 1, checkpoint_frames=interval, backend=backend)
                assert str(raised.value) == str(impossible)
            continue
        for interval in (1, 2, 5, 64, frames + 1):
            path = ctc_viterbi_checkpointed(log_probs, targets, vocab - 1, checkpoint_frames=interval, backend=backend)
            np.testing.assert_array_equal(path.states, whole.states)
            np.testing.assert_array_equal(path.frame_log_probs, whole.frame_log_probs)
            assert not path.wildcard_frames.any()


def test_a_known_path_is_recovered_exactly_across_many_checkpoint_blocks():
    log_probs, spans = spoken(WORDS * 3, seed=1)
    whole = align(log_probs, WORDS * 3)
    blocks = align(log_probs, WORDS * 3, whole_matrix_frame_tokens=0)  # the checkpointed kernel
    assert checkpoint_frames_for(log_probs.shape[0]) < log_probs.shape[0] / 10  # many blocks
    assert word_frames(whole) == word_frames(blocks) == spans
    assert whole.score == blocks.score
    assert whole.tokens == blocks.tokens


@pytest.mark.slow  # loading the tiny model takes most of it
def test_tiny_model_log_probs_align_identically_whole_and_checkpointed(model_cache_dir):
    from speechdata.alignment.acoustic_models import load_ctc_model
    from speechdata.alignment.log_probs import LogProbSettings, compute_log_probs, ctc_model_forward
    from speechdata.alignment.transcript_units import vocabulary_of

    tiny = load_ctc_model("tiny", cache_dir=model_cache_dir)
    audio = (0.1 * np.random.default_rng(3).standard_normal(16_000 * 20)).astype(np.float32)
    # 20 s in 8 s windows: the log-probs are computed as a long recording's are
    [log_probs] = compute_log_probs(ctc_model_forward(tiny), [audio], LogProbSettings(max_window_s=8, context_s=2))
    vocabulary = vocabulary_of(tiny)
    text = " ".join(WORDS * 3)
    duration_ms = 20_000
    whole = align_transcript(log_probs, text, vocabulary, FRAME_MS, duration_ms)
    for interval_forcing in (0, 1):
        checkpointed = align_transcript(
            log_probs, text, vocabulary, FRAME_MS, duration_ms, whole_matrix_frame_tokens=interval_forcing
        )
        assert checkpointed.words == whole.words and checkpointed.tokens == whole.tokens
        assert checkpointed.score == whole.score
    assert len(whole.words) == len(WORDS) * 3


def test_a_20_second_uncovered_stretch_keeps_the_words_boundaries_with_the_wildcard():
    music_frames = 250  # 20 s of 80 ms frames
    after = 7  # the music follows "lazy"
    clean, _ = spoken(WORDS, seed=4)
    noisy, spans = spoken(WORDS, seed=4, music_after=after, music_frames=music_frames)
    wildcard = WildcardSettings()

    with_wildcard = align(noisy, WORDS, wildcard=wildcard)
    assert word_frames(with_wildcard) == spans  # every boundary where it was spoken
    [(start_ms, end_ms)] = with_wildcard.untranscribed
    assert abs(start_ms - spans[after][1] * FRAME_MS) <= FRAME_MS
    assert abs(end_ms - (spans[after][1] + music_frames) * FRAME_MS) <= 3 * FRAME_MS

    # without it the words around the music are dragged into it
    forced = align(noisy, WORDS)
    errors = [abs(a - b) for got, want in zip(word_frames(forced), spans, strict=True) for a, b in zip(got, want)]
    assert max(errors) > 10
    # and on the same speech without music the wildcard changes nothing and reports nothing
    plain, with_nothing = align(clean, WORDS), align(clean, WORDS, wildcard=wildcard)
    assert word_frames(with_nothing) == word_frames(plain)
    assert with_nothing.untranscribed == []


def test_the_wildcard_goes_only_where_its_placement_allows():
    music_frames = 100
    log_probs, spans = spoken(WORDS, seed=5, music_after=7, music_frames=music_frames)
    # "edges" cannot put it after word 7, so the words drift as without a wildcard
    edges = align(log_probs, WORDS, wildcard=WildcardSettings(placement="edges"))
    assert word_frames(edges) != spans
    # a sentence ends at word 7: "sentences" puts it there
    sentences = [*WORDS[:7], WORDS[7] + ".", *WORDS[8:]]
    assert word_frames(align(log_probs, sentences, wildcard=WildcardSettings(placement="sentences"))) == spans


def test_wildcard_positions_cover_word_boundaries_on_both_sides_of_the_separator():
    # "ab c. -- de" for a character model: a b <sp> c <sp> d e, and "--" has no tokens (built by hand,
    # so that how the transcript is normalized does not matter here)
    targets = CtcTargets(
        ["ab", "c.", "--", "de"], [1, 2, 0, 3, 0, 4, 5], [(0, 2), (3, 4), (4, 4), (5, 7)], list("ab c de")
    )
    assert wildcard_positions(targets, "words") == [0, 2, 3, 4, 5, 7]
    assert wildcard_positions(targets, "sentences") == [0, 4, 5, 7]
    assert wildcard_positions(targets, "edges") == [0, 7]
    with pytest.raises(ValueError, match="placement must be one of"):
        WildcardSettings(placement="everywhere")


def test_wildcard_stretches_are_runs_at_least_the_minimum_long():
    flags = np.array([0, 1, 1, 0, 1, 1, 1, 1, 0, 1], dtype=bool)
    assert wildcard_stretches(flags) == [(1, 3), (4, 8), (9, 10)]
    assert wildcard_stretches(flags, min_frames=3) == [(4, 8)]


def test_a_two_hour_recording_fits_the_checkpointed_memory_and_the_cap_stays_for_pathological_input():
    two_hours = int(7200 / 0.08)
    tokens = 100_000  # 17 280 words in characters with separators
    whole_matrix_bytes = two_hours * (2 * tokens + 1)
    assert checkpointed_memory_bytes(two_hours, tokens) < 320 * 2**20 < whole_matrix_bytes / 50
    log_probs = np.zeros((200, VOCABULARY.blank_id + 1), np.float32)
    with pytest.raises(AlignmentRejected, match="too_long_to_align"):
        align(log_probs, ["ab"] * 10, max_frame_tokens=1000)


@pytest.mark.parametrize("codec", ["pcm16", "flac16"])
@pytest.mark.parametrize("held_as", ["bytes", "arrow buffer"])
def test_streamed_audio_windows_are_the_whole_resampled_audio(codec, held_as):
    import pyarrow as pa

    from speechdata.alignment.streamed_audio import StreamedAudio
    from speechdata.audio.codec import decode_audio, encode_audio, quantize_pcm16, resample

    rng = np.random.default_rng(0)
    seconds = np.arange(24_000 * 12) / 24_000
    samples = (0.3 * np.sin(2 * np.pi * 220 * seconds) + 0.05 * rng.standard_normal(seconds.size)).astype(np.float32)
    data = quantize_pcm16(samples).tobytes() if codec == "pcm16" else encode_audio(samples, 24_000, codec)
    decoded = decode_audio(data, codec)
    whole = resample(decoded, 24_000, 16_000)
    payload = pa.py_buffer(data) if held_as == "arrow buffer" else data  # the container's reader gives a buffer
    audio = StreamedAudio(payload, codec, 24_000, decoded.shape[0], 16_000)
    assert audio.shape == whole.shape
    for start, stop in [(0, 64_000), (12_345, 76_345), (150_000, 200_000), (5, 5)]:
        np.testing.assert_allclose(audio[start:stop], whole[start:stop], atol=1e-6)


def test_a_long_alignment_is_cut_into_segments_at_its_longest_pauses_and_its_uncovered_stretches():
    from speechdata.alignment.segmentation import cut_segments
    from speechdata.alignment.table import TimedUnit

    rng = np.random.default_rng(2)
    words, t = [], 0
    for i in range(400):
        t += int(rng.choice([100, 150, 900])) if i else 300
        if i == 200:
            t += 20_000  # untranscribed music
        words.append(TimedUnit(f"w{i}", t, t + 400))
        t += 400
    stretch = (words[199].end_ms + 100, words[200].start_ms - 100)
    segments = cut_segments(words, t + 500, [stretch], max_segment_ms=10_000)

    assert " ".join(s.text for s in segments) == " ".join(w.text for w in words)  # every word once, in order
    assert all(s.end_ms - s.start_ms <= 10_000 + 400 for s in segments)  # pads stay within the pauses
    assert all(a.end_ms <= b.start_ms for a, b in zip(segments, segments[1:]))
    assert any(s.text.endswith("w199") for s in segments) and any(s.text.startswith("w200") for s in segments)
    assert not any(s.start_ms < stretch[1] and stretch[0] < s.end_ms for s in segments)
    by_first = {s.text.split()[0]: s for s in segments}
    # cuts go in the longest pauses (900 ms; a third of all pauses) wherever the window has one
    cuts = [int(s.text.split()[0][1:]) for s in segments[1:]]
    assert sum(words[c].start_ms - words[c - 1].end_ms == 900 for c in cuts) >= 0.85 * len(cuts)
    assert by_first["w0"].start_ms == 150  # half the 300 ms leading pause (under the 200 ms pad)
