"""A landed shard with planted quality defects beside clean utterances, for the quality tests.

The clean utterances are the committed espeak-ng recordings (speech Silero VAD detects, 22.05 kHz
sources, digital silence between clips), landed as FLAC at 16-48 kHz: every one passes the tiny
profile's default policy because it is wide-band speech, unclipped, noise-free and labelled with
its own language. 8 kHz WAV, which ``build_sample_shard`` may pick, is left out on purpose: it *is*
narrow-band. Each planted utterance carries exactly one defect.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import soxr

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.mark import mark_landed
from speechdata.testing.shards import SAMPLE_METADATA_SCHEMA, Clip, _encode, build_sample_shard, load_clips

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
"""Each planted utterance and the reason the default bridge policy must reject it for."""

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


def build_planted_shard(data_root: DataRoot, shard_id: str, n_clean: int = 8) -> list[str]:
    """Land ``n_clean`` clean utterances and every planted one; returns the clean utterances' ids."""
    clips = load_clips()
    clean = build_sample_shard(
        data_root, shard_id, n_clean, seed=3, long_recordings=0, formats=("flac",), complete=False, clips=clips
    )
    rows = clean.to_pylist()
    template = rows[0]
    for utt_id, (samples, language, text) in planted_audio(clips).items():
        audio_path = f"planted/{utt_id}.flac"
        peak = float(np.max(np.abs(samples)))
        data = np.asarray(samples, np.float32) if peak <= 1.0 else np.clip(samples, -1.0, 1.0).astype(np.float32)
        data_root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{audio_path}", _encode(data, RATE, "flac"))
        rows.append({**template, "utt_id": utt_id, "audio_path": audio_path, "language": language, "text": text})
    data_root.write_parquet(
        layout.landing_metadata(shard_id), pa.Table.from_pylist(rows, schema=SAMPLE_METADATA_SCHEMA)
    )
    mark_landed(data_root, shard_id)
    return clean["utt_id"].to_pylist()
