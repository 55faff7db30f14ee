"""The second pass's signals on constructed audio and text, and the policy rules that read them."""

import numpy as np
import pytest

from speechdata.audio.dc_offset import dc_ratio, removable_offset, remove_dc_offset
from speechdata.quality.dnsmos import WINDOW_SAMPLES, windows
from speechdata.quality.policy import PRESETS, QualityPolicy, decide, decide_utterance, default_policies, trim_span
from speechdata.quality.speech_signals import mains_hum_share, speech_snr_db
from speechdata.quality.transcript_checks import (
    hallucination_phrase,
    longest_character_run,
    most_repeated_ngram,
    ngram_repetition,
    rate_bounds,
    speaking_rate,
)
from tests.quality_corpus import varied_voices

RATE = 16_000


@pytest.fixture(scope="module")
def voice():
    clip = varied_voices()[1]
    assert clip.sample_rate == RATE
    return clip.samples.astype(np.float64)


def test_a_constant_offset_is_removed_and_one_that_steps_or_touches_full_scale_is_not(voice):
    offset = (voice + 0.2).astype(np.float32)
    assert dc_ratio(offset) > 0.5
    assert dc_ratio(remove_dc_offset(offset, RATE)) < 1e-3
    step = voice.copy()
    step[step.size // 2 :] += 0.2
    assert removable_offset(step.astype(np.float32), RATE) is None
    railed = np.clip(voice / np.max(np.abs(voice)) + 0.3, -1.0, 1.0).astype(np.float32)
    assert removable_offset(railed, RATE) is None
    ordinary = voice.astype(np.float32)
    assert remove_dc_offset(ordinary, RATE) is ordinary  # bytes of ordinary audio untouched


def test_mains_hum_is_a_share_of_the_power_and_a_steady_voice_is_not_hum(voice):
    t = np.arange(voice.size) / RATE
    rms = float(np.sqrt(np.mean(voice**2)))
    for mains in (50.0, 60.0):
        hum = sum(0.5**k * np.sin(2 * np.pi * mains * (k + 1) * t) for k in range(3))
        hum *= rms / float(np.sqrt(np.mean(hum**2)))  # 0 dB
        share = mains_hum_share((voice + hum).astype(np.float32), RATE)
        assert 0.3 < share < 0.6, mains
    assert mains_hum_share(voice.astype(np.float32), RATE) < 0.01
    # A steady 100 Hz buzz has lines on 50 Hz's harmonics but nothing at 50 Hz: not mains hum.
    buzz = sum(np.sin(2 * np.pi * 100.0 * k * t) / k for k in range(1, 5)) * rms
    assert mains_hum_share((voice + buzz).astype(np.float32), RATE) == 0.0


def test_welch_in_blocks_is_scipys_welch_in_memory_that_does_not_grow(voice):
    from scipy.signal import welch

    from speechdata.quality.signals import welch_in_blocks

    noisy = (voice + 0.01 * np.random.default_rng(0).standard_normal(voice.size)).astype(np.float32)
    for nperseg, nfft, offset in ((480, None, 0.0), (3200, 4096, float(np.mean(noisy)))):
        frequencies, power = welch(noisy.astype(np.float64) - offset, fs=RATE, nperseg=nperseg, nfft=nfft)
        for block_samples in (nperseg, 5 * nperseg + 7, 1 << 21):  # one segment a block, a few, all at once
            found_frequencies, found = welch_in_blocks(noisy, RATE, nperseg, nfft, offset, block_samples)
            np.testing.assert_array_equal(found_frequencies, frequencies)
            np.testing.assert_allclose(found, power, rtol=1e-9, atol=1e-30)


def test_the_speech_snr_reads_noise_in_the_pauses_and_digital_silence_as_clean(voice):
    pad = np.zeros(RATE // 2)
    speech = np.concatenate([pad, voice, pad])
    segments = ((0.5,), (0.5 + voice.size / RATE,))
    assert speech_snr_db(speech.astype(np.float32), RATE, *segments) == 100.0
    rms = float(np.sqrt(np.mean(voice**2)))
    noise = np.random.default_rng(0).standard_normal(speech.size) * rms / np.sqrt(10.0)  # 10 dB under the speech
    measured = speech_snr_db((speech + noise).astype(np.float32), RATE, *segments)
    assert 6.0 < measured < 14.0
    assert speech_snr_db(speech.astype(np.float32), RATE, (), ()) is None


def test_dnsmos_windows_tile_a_short_utterance_and_cover_a_long_one():
    short = np.arange(RATE, dtype=np.float32)
    (window,) = windows(short)
    assert window.size == WINDOW_SAMPLES and window[RATE] == 0.0  # repeated from the start
    long = np.arange(2 * WINDOW_SAMPLES + 5, dtype=np.float32)
    parts = windows(long)
    assert [p[0] for p in parts] == [0.0, float(WINDOW_SAMPLES), float(long.size - WINDOW_SAMPLES)]
    assert windows(np.zeros(0, np.float32)) == []


def test_speaking_rate_counts_letters_and_words_over_speech_seconds():
    letters_per_s, words_per_s = speaking_rate("Don't stop, it's fine.", 2.0)
    assert letters_per_s == pytest.approx(15 / 2.0) and words_per_s == pytest.approx(4 / 2.0)
    assert speaking_rate("", 2.0) == (None, None) and speaking_rate("text", 0.0) == (None, None)
    assert (
        rate_bounds("en-US") == rate_bounds("en")
        and rate_bounds("xx").max_chars_per_s > rate_bounds("en").max_chars_per_s
    )


def test_repetition_measures():
    looped = "thank you so much " * 5
    assert ngram_repetition(looped) > 0.6 and most_repeated_ngram(looped) == 5
    assert ngram_repetition("The quick brown fox jumps over the lazy dog") == 0.0
    assert ngram_repetition("too short") is None
    assert longest_character_run("Nooooooo!") == 7 and longest_character_run("balloon") == 2
    assert hallucination_phrase("Great talk. Thanks  for WATCHING") == "thanks for watching"
    assert hallucination_phrase("We were watching the thanks-giving parade") is None


def row(**signals) -> dict:
    base = {
        "language": "en",
        "duration_s": 4.0,
        "silence_share": 0.1,
        "speech_share": 0.8,
        "leading_silence_s": 0.3,
        "trailing_silence_s": 0.3,
        "speech_s": 3.2,
        "chars_per_s": 13.0,
        "words_per_s": 3.0,
    }
    return {**base, **signals}


@pytest.mark.parametrize(
    ("signals", "reason"),
    [
        ({"duration_s": 0.3}, "too_short"),
        ({"duration_s": 45.0}, "too_long"),
        ({"dc_offset_ratio": 0.4}, "dc_offset"),
        ({"mains_hum_share": 0.2}, "mains_hum"),
        ({"speech_snr_db": 4.0}, "low_speech_snr"),
        ({"dnsmos_bak": 1.8}, "noisy_background"),
        ({"chars_per_s": 30.0}, "speaking_rate_too_fast"),
        ({"words_per_s": 7.0}, "speaking_rate_too_fast"),
        ({"chars_per_s": 4.0}, "speaking_rate_too_slow"),
        ({"ngram_repetition": 0.7, "most_repeated_ngram": 5}, "transcript_repetition"),
        ({"longest_character_run": 9}, "transcript_repetition"),
        ({"hallucination_phrase": "thanks for watching"}, "transcript_repetition"),
        ({"leading_silence_s": 2.5}, "long_edge_silence"),
    ],
)
def test_each_new_filter_rejects_with_its_own_reason_under_the_bridge_preset(signals, reason):
    assert decide(row(), PRESETS["bridge"]) is None
    verdict = decide_utterance(row(**signals), PRESETS["bridge"])
    assert verdict.reason == reason, verdict.detail


def test_a_sentence_read_twice_is_not_repetition_and_german_may_be_faster_than_english():
    policy = PRESETS["bridge"]
    assert decide(row(ngram_repetition=0.5, most_repeated_ngram=2), policy) is None
    assert decide(row(language="de", chars_per_s=23.0), policy) is None
    assert decide(row(language="en", chars_per_s=23.0), policy)[0] == "speaking_rate_too_fast"
    assert decide(row(chars_per_s=23.0), policy.with_overrides({"max_speaking_rate_factor": 1.2})) is None
    # Languages written without spaces are judged by letters only.
    assert decide(row(language="ja", chars_per_s=10.0, words_per_s=0.2), policy) is None


def test_asr_trims_long_edge_silence_and_judges_the_rest_while_the_bridge_rejects_it():
    signals = row(duration_s=9.0, leading_silence_s=3.0, trailing_silence_s=2.8, speech_share=0.35, silence_share=0.62)
    bridge = decide_utterance(signals, PRESETS["bridge"])
    assert bridge.reason == "long_edge_silence" and "leading_silence_s 3 s > 1.5 s" in bridge.detail
    asr = decide_utterance(signals, PRESETS["asr"])
    assert asr.reason is None and (asr.keep_start_s, asr.keep_end_s) == (2.8, 6.4)
    # Trimmed is not a free pass: the rest is judged, here too short once the silence is gone.
    short = row(duration_s=6.0, leading_silence_s=3.0, trailing_silence_s=2.7, speech_s=0.3, speech_share=0.05)
    strict = PRESETS["asr"].with_overrides({"min_duration_s": 1.0})
    assert decide_utterance(short, strict).reason == "too_short"  # 0.7 s kept
    assert trim_span(row(), PRESETS["asr"]) is None  # nothing over the limit


def test_the_new_filters_are_on_in_tiny_and_can_be_turned_off_by_reason():
    tiny = default_policies("tiny")
    for product in ("bridge", "asr", "translation"):
        assert tiny[product].min_dnsmos_bak is not None and tiny[product].max_speaking_rate_factor is not None
    off = tiny["bridge"].with_overrides({}, ["noisy_background", "transcript_repetition", "long_edge_silence"])
    assert decide(row(dnsmos_bak=1.0, hallucination_phrase="www.", leading_silence_s=5.0), off) is None
    with pytest.raises(ValueError, match="unknown threshold"):
        QualityPolicy().with_overrides({"max_hum": 0.1})


def test_the_resource_loads_dnsmos_once_per_process_and_it_hears_noise_under_speech(voice):
    from resources.quality import QualityModelsResource

    dnsmos = QualityModelsResource(profile="tiny").dnsmos()
    assert QualityModelsResource().dnsmos() is dnsmos
    rms = float(np.sqrt(np.mean(voice**2)))
    noisy = voice + np.random.default_rng(1).standard_normal(voice.size) * rms  # 0 dB white noise
    clean_score, noisy_score, silent = dnsmos.score(
        [voice.astype(np.float32), np.clip(noisy, -1, 1).astype(np.float32), np.zeros(RATE, np.float32)]
    )
    assert clean_score.bak > 2.6 > 2.2 > noisy_score.bak
    assert 1.0 <= noisy_score.ovrl < clean_score.ovrl <= 5.0
    assert silent is None
