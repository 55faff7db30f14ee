"""A landed shard with planted quality defects beside clean utterances, for the quality tests.

Two sets of clean utterances: the sample recordings below, and sixteen of varied voices, speeds
and pitches in four languages (``tests/fixtures/quality_speech``, made by its ``generate.py``).
The defects of the second pass (speaking rate, DC, hum, babble, duration, edge silence, transcript
repetition) are built from those at run time, so no defect needs a committed file of its own.

The clean utterances are the committed espeak-ng recordings (speech Silero VAD detects, 22.05 kHz
sources, digital silence between clips), landed as FLAC at 16-48 kHz: every one passes the tiny
profile's default policy because it is wide-band speech, unclipped, noise-free and labelled with
its own language. 8 kHz WAV, which ``build_sample_shard`` may pick, is left out on purpose: it *is*
narrow-band. Each planted utterance carries exactly one defect.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import soxr

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.mark import mark_landed
from speechdata.testing.shards import SAMPLE_METADATA_SCHEMA, Clip, _encode, build_sample_shard, load_clips

VARIED_VOICES_DIR = Path(__file__).resolve().parent / "fixtures" / "quality_speech"

PLANTED_REASONS = {
    "planted_german_labelled_en": "language_mismatch",
    "planted_french_labelled_de": "language_mismatch",
    "planted_telephone_8k": "narrowband",
    "planted_clipped": "clipped",
    "planted_silence": "mostly_silence",
    "planted_chord": "no_speech",
    "planted_melody": "no_speech",
    "planted_noisy": "low_snr",
}
"""Each planted utterance of the first pass and the reason the default bridge policy must reject it for."""

SECOND_PASS_REASONS = {
    "planted_truncated_half": "speaking_rate_too_fast",
    "planted_extra_sentence": "speaking_rate_too_fast",
    "planted_missing_words": "speaking_rate_too_slow",
    "planted_dc_drift": "dc_offset",
    "planted_mains_hum": "mains_hum",
    "planted_babble": "low_snr",  # WADA-SNR reads it 8 dB; DNSMOS's background score is what babble does not fool
    "planted_too_short": "too_short",
    "planted_too_long": "too_long",
    "planted_long_edge_silence": "long_edge_silence",
    "planted_repeated_transcript": "transcript_repetition",
    "planted_stock_phrase": "transcript_repetition",
}
"""Each planted utterance of the second pass and the reason the default bridge policy rejects it for."""

REPAIRED = {"planted_dc_constant": "a constant DC offset, removed by normalization"}
"""Planted faults that normalization repairs: every product keeps them."""

ASR_TRIMMED = "planted_long_edge_silence"
"""The ASR preset trims its edge silence and keeps it; the bridge and translation reject it."""

RATE = 44_100


def _clip(clips: list[Clip], utt_id: str) -> Clip:
    return next(c for c in clips if c.utt_id == utt_id)


def _at(samples: np.ndarray, rate: int, target: int = RATE) -> np.ndarray:
    return soxr.resample(samples, rate, target).astype(np.float32)


def _padded(samples: np.ndarray) -> np.ndarray:
    gap = np.zeros(int(0.3 * RATE), np.float32)
    return np.concatenate([gap, samples, gap])


def planted_audio(clips: list[Clip]) -> dict[str, tuple[np.ndarray, str, str]]:
    """``{utt_id: (samples at 44.1 kHz, landed language, landed text)}`` of every planted utterance."""
    rng = np.random.default_rng(7)
    english = _clip(clips, "en_0002")
    speech = _padded(_at(english.samples, english.sample_rate))
    german, french = _clip(clips, "de_0001"), _clip(clips, "fr_0001")
    t = np.arange(3 * RATE) / RATE
    chord = sum(0.15 * np.sin(2 * np.pi * f * t) for f in (261.6, 329.6, 392.0)) * (
        0.6 + 0.4 * np.sin(2 * np.pi * 2 * t)
    )
    notes = np.repeat([440.0, 494.0, 523.0, 587.0, 659.0, 698.0], RATE // 2)[: t.size]
    melody = 0.3 * np.sin(2 * np.pi * np.cumsum(notes) / RATE)
    # ~1 % of the samples pushed past full scale: above the bridge's 0.1 %, below normalization's 5 %.
    clipped = np.clip(speech / np.quantile(np.abs(speech), 0.99), -1.0, 1.0)
    speech_rms = float(np.sqrt(np.mean(speech**2)))
    noisy = speech + rng.standard_normal(speech.size).astype(np.float32) * speech_rms
    return {
        "planted_german_labelled_en": (_padded(_at(german.samples, german.sample_rate)), "en", german.text),
        "planted_french_labelled_de": (_padded(_at(french.samples, french.sample_rate)), "de", french.text),
        "planted_telephone_8k": (_at(_at(speech, RATE, 8_000), 8_000), "en", english.text),
        "planted_clipped": (clipped, "en", english.text),
        "planted_silence": (rng.standard_normal(3 * RATE) * 0.0005, "en", english.text),
        "planted_chord": (chord, "en", english.text),
        "planted_melody": (melody, "en", english.text),
        "planted_noisy": (noisy, "en", english.text),
    }


def varied_voices() -> list[Clip]:
    """The sixteen clean utterances of varied voices, speeds and pitches (16 kHz)."""
    return load_clips(VARIED_VOICES_DIR)


def _mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    noise = np.resize(noise, speech.size)
    speech_power = float(np.mean(speech**2))
    noise_power = float(np.mean(noise**2))
    return speech + noise * np.sqrt(speech_power / noise_power / 10 ** (snr_db / 10.0))


def second_pass_audio(voices: list[Clip]) -> dict[str, tuple[np.ndarray, str, str]]:
    """``{utt_id: (samples at 44.1 kHz, landed language, landed text)}`` of the second pass's
    planted utterances (and the repaired ones), all built from the varied voices."""
    english = [c for c in voices if c.language == "en"]
    base, other = english[1], english[5]  # 165 wpm; a different voice and sentence
    speech = _padded(_at(base.samples, base.sample_rate))
    t = np.arange(speech.size) / RATE
    words = base.text.split()
    half = speech[: speech.size // 2]
    drift = speech + np.where(t > t[-1] / 2, 0.3, 0.0).astype(np.float32)  # a step: not one offset
    hum = sum(0.5**k * np.sin(2 * np.pi * 50.0 * (k + 1) * t) for k in range(4))
    hum_at = _mix_at_snr(speech, hum.astype(np.float32), 10.0)
    # Babble: four other voices (different speakers, sentences) summed, under the speech at 0 dB.
    talkers = [c for c in voices if c.utt_id != base.utt_id][2:6]
    babble = sum(np.resize(_at(c.samples, c.sample_rate), speech.size) for c in talkers)
    babble_at = _mix_at_snr(speech, babble.astype(np.float32), 0.0)
    silence = np.zeros(int(2.5 * RATE), np.float32)
    long_parts, long_text = [], []
    for clip in english + english[:3]:  # just over 30 s
        long_parts += [_at(clip.samples, clip.sample_rate), np.zeros(int(0.4 * RATE), np.float32)]
        long_text.append(clip.text)
    return {
        "planted_truncated_half": (half, "en", base.text),
        "planted_extra_sentence": (speech, "en", f"{base.text} {other.text}"),
        "planted_missing_words": (speech, "en", " ".join(words[: max(2, len(words) // 3)])),
        "planted_dc_drift": (drift.astype(np.float32), "en", base.text),
        "planted_dc_constant": ((speech * 0.8 + 0.15).astype(np.float32), "en", base.text),
        "planted_mains_hum": (hum_at.astype(np.float32), "en", base.text),
        "planted_babble": (babble_at.astype(np.float32), "en", base.text),
        "planted_too_short": (_at(base.samples, base.sample_rate)[: int(0.35 * RATE)], "en", words[0]),
        "planted_too_long": (np.concatenate(long_parts), "en", " ".join(long_text)),
        "planted_long_edge_silence": (np.concatenate([silence, speech, silence]), "en", base.text),
        "planted_repeated_transcript": (speech, "en", " ".join([" ".join(words[:3])] * 6)),
        "planted_stock_phrase": (speech, "en", f"{base.text} Thanks for watching!"),
    }


def build_planted_shard(
    data_root: DataRoot, shard_id: str, n_clean: int = 8, *, first_pass: bool = True, second_pass: bool = False
) -> list[str]:
    """Land ``n_clean`` clean utterances and every planted one; returns the clean utterances' ids.

    ``first_pass``: the planted utterances of :data:`PLANTED_REASONS`. ``second_pass``: the sixteen
    varied-voice clean utterances too, and the second pass's planted ones
    (:data:`SECOND_PASS_REASONS`, :data:`REPAIRED`)."""
    clips = load_clips()
    clean = build_sample_shard(
        data_root, shard_id, max(n_clean, 1), seed=3, long_recordings=0, formats=("flac",), complete=False, clips=clips
    )
    rows = clean.to_pylist()
    template = rows[0]
    rows = rows[:n_clean]
    clean_ids = [row["utt_id"] for row in rows]
    planted = planted_audio(clips) if first_pass else {}
    if second_pass:
        voices = varied_voices()
        planted.update(second_pass_audio(voices))
        planted.update({c.utt_id: (_at(c.samples, c.sample_rate), c.language, c.text) for c in voices})
        clean_ids += [c.utt_id for c in voices]
    for utt_id, (samples, language, text) in planted.items():
        audio_path = f"planted/{utt_id}.flac"
        peak = float(np.max(np.abs(samples)))
        data = np.asarray(samples, np.float32) if peak <= 1.0 else np.clip(samples, -1.0, 1.0).astype(np.float32)
        data_root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{audio_path}", _encode(data, RATE, "flac"))
        rows.append({**template, "utt_id": utt_id, "audio_path": audio_path, "language": language, "text": text})
    data_root.write_parquet(
        layout.landing_metadata(shard_id), pa.Table.from_pylist(rows, schema=SAMPLE_METADATA_SCHEMA)
    )
    mark_landed(data_root, shard_id)
    return clean_ids
