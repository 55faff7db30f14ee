"""Near-duplicate signals and matching on the planted set: every planted copy found, no look-alike
flagged, the representative always the copy indexed first (speechdata.quality)."""

import io

import numpy as np
import pytest
import soundfile as sf

from speechdata.quality.fingerprint_audio import audio_fingerprint, compare_at_offset, exact_audio_hash
from speechdata.quality.fingerprint_text import normalized_transcript
from speechdata.quality.near_dup_matching import (
    EXACT_AUDIO,
    KINDS,
    NEAR_AUDIO,
    NEAR_TRANSCRIPT,
    NearDuplicateThresholds,
    find_representatives,
)
from speechdata.quality.near_dup_planted import (
    AUDIO_TRANSFORMS,
    NEGATIVE_KINDS,
    SAMPLE_RATE,
    TRANSCRIPT_TRANSFORMS,
    Speaker,
    planted_set,
    score,
    speech_like,
    transformed,
)
from speechdata.quality.near_duplicates import utterance_signals

AUDIO_ONLY = NearDuplicateThresholds(check_transcripts=False)


@pytest.fixture(scope="module")
def planted():
    """28 originals, 28 copies (four of each transform), 28 look-alikes (nine or ten of each kind)."""
    utterances = planted_set(28, seed=3)
    signals = [utterance_signals("s", u.utt_id, u.samples, SAMPLE_RATE, u.text) for u in utterances]
    return utterances, signals


def flags(signals, thresholds):
    decisions = find_representatives([], signals, thresholds)
    return {d.utt_id: (d.kind, d.representative_utt) for d in decisions if d.kind in KINDS}


def test_planted_set_precision_and_recall_reach_the_targets(planted):
    utterances, signals = planted
    every_signal = score(utterances, flags(signals, NearDuplicateThresholds()))
    audio_alone = score(utterances, flags(signals, AUDIO_ONLY), AUDIO_TRANSFORMS)
    for measured in (every_signal, audio_alone):
        assert measured.precision >= 0.95, measured
        assert measured.recall >= 0.9, measured


@pytest.mark.parametrize("transform", AUDIO_TRANSFORMS)
def test_each_planted_audio_transform_is_found_from_the_audio_alone(planted, transform):
    utterances, signals = planted
    flagged = flags(signals, AUDIO_ONLY)
    copies = [u for u in utterances if u.transform == transform]
    assert copies
    for copy in copies:
        assert flagged.get(copy.utt_id) == (copy.expected_kind, copy.copy_of), (copy.utt_id, flagged.get(copy.utt_id))


@pytest.mark.parametrize("transform", TRANSCRIPT_TRANSFORMS)
def test_the_same_words_under_other_audio_are_a_transcript_duplicate_only(planted, transform):
    utterances, signals = planted
    with_text, audio_only = flags(signals, NearDuplicateThresholds()), flags(signals, AUDIO_ONLY)
    copies = [u for u in utterances if u.transform == transform]
    assert copies
    for copy in copies:
        assert with_text.get(copy.utt_id) == (NEAR_TRANSCRIPT, copy.copy_of)
        assert copy.utt_id not in audio_only


@pytest.mark.parametrize("kind", NEGATIVE_KINDS)
def test_look_alikes_that_are_no_copies_are_not_flagged(planted, kind):
    utterances, signals = planted
    flagged = flags(signals, NearDuplicateThresholds())
    negatives = [u for u in utterances if u.negative == kind]
    assert negatives
    assert [u.utt_id for u in negatives if u.utt_id in flagged] == []
    assert [u.utt_id for u in utterances if u.copy_of is None and u.utt_id in flagged] == []


def test_a_spliced_look_alike_is_far_from_its_original_while_a_trimmed_copy_is_close():
    rng = np.random.default_rng(5)
    speaker = Speaker(140.0, 1.0)
    original = speech_like(rng, speaker, 6.0)
    spliced = np.concatenate([original[: len(original) // 2], speech_like(rng, speaker, 3.0)])
    trimmed = transformed(rng, original, "trimmed")
    fingerprint = audio_fingerprint(original, SAMPLE_RATE)
    signals = [
        utterance_signals("s", name, samples, SAMPLE_RATE, None)
        for name, samples in (("a", original), ("b", spliced), ("c", trimmed))
    ]
    decisions = {d.utt_id: d for d in find_representatives([], signals, AUDIO_ONLY)}
    assert decisions["b"].kind is None
    assert decisions["c"].kind == NEAR_AUDIO and decisions["c"].representative_utt == "a"
    same_start = compare_at_offset(fingerprint, audio_fingerprint(spliced, SAMPLE_RATE), 0)
    assert same_start.bit_error_rate > AUDIO_ONLY.max_bit_error_rate


def test_the_exact_hash_ignores_the_container_and_the_silence_around():
    samples = speech_like(np.random.default_rng(1), Speaker(120.0, 1.0), 2.0)
    pcm = np.rint(samples * 32767).astype(np.int16)
    wav, flac = (decoded(pcm, container) for container in ("WAV", "FLAC"))
    padded = np.concatenate([np.zeros(4_800, np.float32), wav, np.zeros(100, np.float32)])
    assert exact_audio_hash(wav) == exact_audio_hash(flac) == exact_audio_hash(padded)
    assert exact_audio_hash(wav) == exact_audio_hash(pcm)
    one_sample_changed = wav.copy()
    one_sample_changed[SAMPLE_RATE] += np.float32(1 / 32768)
    assert exact_audio_hash(one_sample_changed) != exact_audio_hash(wav)


def decoded(samples: np.ndarray, container: str) -> np.ndarray:
    buffer = io.BytesIO()
    sf.write(buffer, samples, SAMPLE_RATE, format=container, subtype="PCM_16")
    buffer.seek(0)
    return sf.read(buffer, dtype="float32")[0]


def test_silence_and_short_transcripts_make_no_duplicates():
    silence = np.zeros(SAMPLE_RATE * 2, np.float32)
    rng = np.random.default_rng(2)
    voices = [speech_like(rng, Speaker(100.0 + 40 * n, 1.0), 3.0) for n in range(2)]
    signals = [
        utterance_signals("s", "silent-a", silence, SAMPLE_RATE, "one two three four five"),
        utterance_signals("s", "silent-b", silence, SAMPLE_RATE, "completely different words spoken here now"),
        utterance_signals("s", "yes-a", voices[0], SAMPLE_RATE, "Yes."),
        utterance_signals("s", "yes-b", voices[1], SAMPLE_RATE, "yes"),
    ]
    assert signals[0].exact_hash is None and not signals[0].fingerprint.active.any()
    assert [d.kind for d in find_representatives([], signals, NearDuplicateThresholds())] == [None] * 4


def test_the_representative_is_the_copy_indexed_first_even_through_a_chain_of_copies():
    rng = np.random.default_rng(4)
    original = speech_like(rng, Speaker(180.0, 0.9), 5.0)
    quieter = transformed(rng, original, "gain")
    indexed = [(utterance_signals("early", "first", original, SAMPLE_RATE, None), ("early", "first"))]
    new = [
        utterance_signals("late", "x-copy", quieter, SAMPLE_RATE, None),
        utterance_signals("late", "y-copy-of-copy", transformed(rng, quieter, "resampled"), SAMPLE_RATE, None),
        utterance_signals("late", "z-same", original.copy(), SAMPLE_RATE, None),
    ]
    decisions = find_representatives(indexed, new, NearDuplicateThresholds())
    assert [(d.kind, d.representative_shard, d.representative_utt) for d in decisions] == [
        (NEAR_AUDIO, "early", "first"),
        (NEAR_AUDIO, "early", "first"),
        (EXACT_AUDIO, "early", "first"),
    ]


def test_transcripts_are_compared_after_case_punctuation_and_spacing_are_folded():
    assert normalized_transcript("  Hello,   WORLD!  It's\tme… ") == "hello world it s me"
    assert normalized_transcript(None) == ""


def test_every_column_of_the_near_duplicates_file_is_described_in_the_file_and_the_ui():
    from assets.near_duplicates import NearDuplicatesConfig
    from speechdata.quality.near_duplicates import COLUMN_DESCRIPTIONS, NEAR_DUPLICATES_SCHEMA

    assert [f.name for f in NEAR_DUPLICATES_SCHEMA if not (f.metadata or {}).get(b"description")] == []
    assert set(COLUMN_DESCRIPTIONS) == set(NEAR_DUPLICATES_SCHEMA.names)
    defaults = NearDuplicatesConfig().thresholds()
    assert defaults == NearDuplicateThresholds()
