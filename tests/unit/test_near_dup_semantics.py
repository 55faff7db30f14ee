"""What is a duplicate (docs/near-duplicates.md, "What is a duplicate"): tempo- and pitch-shifted
copies found from the audio alone, a clip of an earlier utterance rejected while an utterance holding
an earlier one plus new speech is kept, and the same transcript by another speaker kept."""

import numpy as np
import pytest

from speechdata.quality.fingerprint_envelope import shape_correlation, shift_signature
from speechdata.quality.near_dup_matching import (
    CONTAINED_AUDIO,
    CONTAINS_EARLIER,
    KINDS,
    NEAR_AUDIO,
    NEAR_TRANSCRIPT,
    OTHER_SPEAKER_READING,
    SHIFTED_AUDIO,
    NearDuplicateThresholds,
    UtteranceSignals,
    find_representatives,
)
from speechdata.quality.near_dup_planted import (
    EXTENDED_AUDIO_TRANSFORMS,
    SAMPLE_RATE,
    Speaker,
    planted_set,
    speech_like,
)
from speechdata.quality.near_duplicates import utterance_signals
from speechdata.quality.speakers import SAME_SPEAKER_MIN_COSINE

AUDIO_ONLY = NearDuplicateThresholds(check_transcripts=False)


@pytest.fixture(scope="module")
def extended():
    """11 originals: every transform once, the container look-alike twice."""
    utterances = planted_set(11, seed=5, extended=True)
    signals = [utterance_signals("s", u.utt_id, u.samples, SAMPLE_RATE, u.text) for u in utterances]
    decisions = {d.utt_id: d for d in find_representatives([], signals, AUDIO_ONLY)}
    return utterances, decisions


@pytest.mark.parametrize("transform", [t for t in EXTENDED_AUDIO_TRANSFORMS if t != "clip"])
def test_tempo_pitch_and_padded_copies_are_found_from_the_audio_alone(extended, transform):
    utterances, decisions = extended
    copies = [u for u in utterances if u.transform == transform]
    assert len(copies) == 1
    for copy in copies:
        found = decisions[copy.utt_id]
        assert (found.kind, found.representative_utt) == (copy.expected_kind, copy.copy_of), found


def test_a_clip_of_an_earlier_utterance_is_its_duplicate(extended):
    utterances, decisions = extended
    clips = [u for u in utterances if u.transform == "clip"]
    kinds = {decisions[u.utt_id].kind for u in clips}
    assert kinds <= {CONTAINED_AUDIO, NEAR_AUDIO, None} and kinds & {CONTAINED_AUDIO, NEAR_AUDIO}
    for clip in clips:
        assert decisions[clip.utt_id].kind is None or decisions[clip.utt_id].representative_utt == clip.copy_of


def test_an_utterance_holding_an_earlier_one_plus_new_speech_is_kept_and_flagged(extended):
    utterances, decisions = extended
    containers = [u for u in utterances if u.negative == "container"]
    assert len(containers) == 2
    for container in containers:
        decision = decisions[container.utt_id]
        assert decision.kind == CONTAINS_EARLIER, decision
        assert decision.representative_utt == container.utt_id  # kept: its own representative
        assert decision.matched_utt.startswith("orig-")
    every_lookalike = [u.utt_id for u in utterances if u.copy_of is None]
    assert not [u for u in every_lookalike if decisions[u].kind in KINDS]


def test_a_clip_landed_first_stays_and_its_container_landed_later_is_kept_too():
    rng = np.random.default_rng(11)
    voice = Speaker(140.0, 1.0)
    clip = speech_like(rng, voice, 3.0)
    container = np.concatenate([speech_like(rng, voice, 2.5), clip, speech_like(rng, voice, 2.5)])
    signals = [
        utterance_signals("s", "a-clip", clip, SAMPLE_RATE, None),
        utterance_signals("s", "b-container", container, SAMPLE_RATE, None),
        utterance_signals(
            "s", "c-clip-again", container[int(3.0 * SAMPLE_RATE) : int(5.0 * SAMPLE_RATE)], SAMPLE_RATE, None
        ),
    ]
    decisions = {d.utt_id: d for d in find_representatives([], signals, AUDIO_ONLY)}
    assert decisions["a-clip"].kind is None
    assert (decisions["b-container"].kind, decisions["b-container"].matched_utt) == (CONTAINS_EARLIER, "a-clip")
    assert decisions["b-container"].representative_utt == "b-container"
    # A clip inside both names the earliest utterance that holds it, through its representative.
    assert decisions["c-clip-again"].kind in (NEAR_AUDIO, CONTAINED_AUDIO)
    assert decisions["c-clip-again"].representative_utt == "a-clip"


def _with_speaker(signals: UtteranceSignals, embedding: np.ndarray) -> UtteranceSignals:
    from dataclasses import replace

    return replace(signals, speaker_embedding=(embedding / np.linalg.norm(embedding)).astype(np.float32))


def test_the_same_words_by_another_speaker_are_flagged_and_by_the_same_speaker_rejected():
    rng = np.random.default_rng(2)
    voices = [Speaker(110.0, 0.95), Speaker(210.0, 1.15)]
    text = "the committee will publish its final report next spring"
    first, second = rng.standard_normal(256), rng.standard_normal(256)
    near_first = first + 0.2 * rng.standard_normal(256)
    assert np.dot(first, near_first) / np.linalg.norm(first) / np.linalg.norm(near_first) >= SAME_SPEAKER_MIN_COSINE
    made = [utterance_signals("s", f"u{n}", speech_like(rng, voices[n % 2], 3.5), SAMPLE_RATE, text) for n in range(3)]
    signals = [_with_speaker(made[0], first), _with_speaker(made[1], second), _with_speaker(made[2], near_first)]
    decisions = {d.utt_id: d for d in find_representatives([], signals, NearDuplicateThresholds())}
    assert decisions["u0"].kind is None
    assert (decisions["u1"].kind, decisions["u1"].matched_utt, decisions["u1"].representative_utt) == (
        OTHER_SPEAKER_READING,
        "u0",
        "u1",
    )
    assert (decisions["u2"].kind, decisions["u2"].representative_utt) == (NEAR_TRANSCRIPT, "u0")
    # Without embeddings (indexed before speakers were stored) a transcript match stays a duplicate.
    plain = {d.utt_id: d.kind for d in find_representatives([], made, NearDuplicateThresholds())}
    assert plain == {"u0": None, "u1": NEAR_TRANSCRIPT, "u2": NEAR_TRANSCRIPT}


def test_flat_or_short_audio_has_no_shift_signature_and_shapes_compare_across_a_pitch_shift():
    assert shift_signature(np.zeros(SAMPLE_RATE * 3, np.float32), SAMPLE_RATE) is None
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE).astype(np.float32)
    assert shift_signature(tone, SAMPLE_RATE) is None  # a steady tone: no loudness shape
    rng = np.random.default_rng(4)
    speech = speech_like(rng, Speaker(150.0, 1.0), 4.0)
    assert shift_signature(speech[: SAMPLE_RATE // 2], SAMPLE_RATE) is None
    signature = shift_signature(speech, SAMPLE_RATE)
    shifted = np.roll(signature.spectral_shape, 2, axis=1)
    assert shape_correlation(signature.spectral_shape, shifted) > 0.9
    other = shift_signature(speech_like(rng, Speaker(150.0, 1.0), 4.0), SAMPLE_RATE)
    assert shape_correlation(signature.spectral_shape, other.spectral_shape) < 0.9
    assert SHIFTED_AUDIO in KINDS
