"""Build landing shards of any size from the committed sample recordings.

Each utterance concatenates one to three clips of one language with random silence around and
between them, encoded in a rotating mix of formats (WAV, FLAC, MP3, Ogg/Opus), sample rates and
channel counts. Some shards also carry long recordings described by ``start_s``/``end_s`` segments
(the aligned-JSON corpus layout). Everything is seeded, so the same arguments give the same shard.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import soundfile as sf
import soxr

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.contract import CONTRACT_FIELDS
from speechdata.landing.mark import mark_landed

FIXTURES_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "speech"

COUNTRIES_BY_LANGUAGE = {"en": ["us", "gb"], "de": ["de", "at"], "fr": ["fr"], "es": ["es", "mx"]}

# (extension, soundfile format, subtype, sample rates it supports here)
AUDIO_FORMATS = {
    "wav": ("WAV", "PCM_16", (8_000, 16_000, 44_100, 48_000)),
    "flac": ("FLAC", "PCM_16", (16_000, 22_050, 44_100, 48_000)),
    "mp3": ("MP3", "MPEG_LAYER_III", (16_000, 22_050, 44_100, 48_000)),
    "opus": ("OGG", "OPUS", (16_000, 48_000)),
}


@dataclass(frozen=True)
class Clip:
    utt_id: str
    language: str
    text: str
    samples: np.ndarray
    sample_rate: int
    voice: str | None = None
    """The synthesizer's voice, when known: it lands as the utterance's ``speaker``."""


def load_clips(fixtures_dir: Path = FIXTURES_DIR) -> list[Clip]:
    entries = json.loads((fixtures_dir / "transcripts.json").read_text())
    clips = []
    for entry in entries:
        samples, rate = sf.read(fixtures_dir / entry["file"], dtype="float32")
        clips.append(Clip(entry["utt_id"], entry["language"], entry["text"], samples, rate))
    return clips


def _encode(samples: np.ndarray, rate: int, fmt: str) -> bytes:
    container, subtype, _ = AUDIO_FORMATS[fmt]
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=container, subtype=subtype)
    return buffer.getvalue()


def _render(clips: list[Clip], rng: np.random.Generator, rate: int, channels: int) -> np.ndarray:
    base_rate = clips[0].sample_rate
    parts = [np.zeros(int(rng.uniform(0.05, 0.6) * base_rate), np.float32)]
    for clip in clips:
        parts.append(clip.samples)
        parts.append(np.zeros(int(rng.uniform(0.1, 0.8) * base_rate), np.float32))
    mono = np.concatenate(parts)
    if rate != base_rate:
        mono = soxr.resample(mono, base_rate, rate).astype(np.float32)
    if channels == 1:
        return mono
    # A slightly different second channel, so a downmix is an average and not a copy.
    return np.stack([mono, 0.8 * mono], axis=1)


def build_sample_shard(
    data_root: DataRoot,
    shard_id: str,
    n_utterances: int = 8,
    *,
    seed: int = 0,
    long_recordings: int = 1,
    as_tar: bool = False,
    formats: tuple[str, ...] = ("wav", "flac", "mp3", "opus"),
    complete: bool = True,
    with_faults: bool = False,
    clips: list[Clip] | None = None,
) -> pa.Table:
    """Land a shard under ``<data root>/landing/<shard_id>`` and return its metadata table.

    ``n_utterances`` standalone files, plus ``long_recordings`` recordings of three clips each,
    described by one segment row per clip. ``complete=False`` leaves out ``_SUCCESS``.
    ``with_faults=True`` adds one row for each of :data:`FAULT_REASONS`, which ingest must reject.
    """
    rng = np.random.default_rng(seed)
    clips = clips or load_clips()
    by_language: dict[str, list[Clip]] = {}
    for clip in clips:
        by_language.setdefault(clip.language, []).append(clip)
    languages = sorted(by_language)

    files: dict[str, bytes] = {}
    rows: list[dict] = []
    for i in range(n_utterances):
        language = languages[i % len(languages)]
        picked = [by_language[language][j] for j in rng.choice(len(by_language[language]), rng.integers(1, 4))]
        fmt = formats[i % len(formats)]
        rate = int(rng.choice(AUDIO_FORMATS[fmt][2]))
        channels = 2 if i % 3 == 2 else 1
        audio_path = f"{language}/{shard_id}_{i:05d}.{fmt}"
        files[audio_path] = _encode(_render(picked, rng, rate, channels), rate, fmt)
        rows.append(_row(f"{shard_id}_{i:05d}", audio_path, picked, language, rng, None, None))

    for r in range(long_recordings):
        language = languages[r % len(languages)]
        picked = [by_language[language][j % len(by_language[language])] for j in range(3)]
        base_rate = picked[0].sample_rate
        gap = np.zeros(int(0.5 * base_rate), np.float32)
        audio_path = f"recordings/{shard_id}_rec{r:03d}.flac"
        position, pieces = 0.0, []
        for k, clip in enumerate(picked):
            pieces += [gap, clip.samples]
            start_s = position + len(gap) / base_rate
            end_s = start_s + len(clip.samples) / base_rate
            position = end_s
            rows.append(_row(f"{shard_id}_rec{r:03d}_{k:02d}", audio_path, [clip], language, rng, start_s, end_s))
        pieces.append(gap)
        files[audio_path] = _encode(np.concatenate(pieces), base_rate, "flac")

    return _land(data_root, shard_id, files, rows, rng, with_faults=with_faults, as_tar=as_tar, complete=complete)


SAMPLE_METADATA_SCHEMA = pa.schema(
    [
        *CONTRACT_FIELDS,
        ("speaker", pa.string()),
        ("quality_score", pa.float64()),
    ]
)


def _row(utt_id, audio_path, picked, language, rng, start_s, end_s) -> dict:
    return {
        "utt_id": utt_id,
        "audio_path": audio_path,
        "text": " ".join(c.text for c in picked),
        "language": language,
        # Codes only (the landing contract): a language with no country here lands without one.
        "country": str(rng.choice(COUNTRIES_BY_LANGUAGE[language])) if language in COUNTRIES_BY_LANGUAGE else None,
        "start_s": start_s,
        "end_s": end_s,
        "source": "espeak-ng-sample",
        "speaker": picked[0].voice or f"espeak-{language}",
        "quality_score": round(float(rng.uniform(0.5, 1.0)), 3),
    }


FAULT_REASONS = (
    "utt_id_has_dot",
    "audio_not_found",
    "audio_unreadable",
    "segment_past_end_of_file",
    "segment_start_not_before_end",
)
"""The reject reasons ``with_faults=True`` provokes, one row each."""


def _add_faults(shard_id: str, files: dict[str, bytes], rows: list[dict], rng: np.random.Generator) -> None:
    good = rows[0]
    files[f"faults/{shard_id}_corrupt.wav"] = b"RIFF\x00\x00\x00\x00WAVEnot really audio"
    faults = [
        (f"{shard_id}_fault.dotted", good["audio_path"], None, None),
        (f"{shard_id}_fault_missing", "faults/does_not_exist.wav", None, None),
        (f"{shard_id}_fault_corrupt", f"faults/{shard_id}_corrupt.wav", None, None),
        (f"{shard_id}_fault_past_end", good["audio_path"], 0.0, 3600.0),
        (f"{shard_id}_fault_reversed", good["audio_path"], 2.0, 1.0),
    ]
    for utt_id, audio_path, start_s, end_s in faults:
        rows.append({**good, "utt_id": utt_id, "audio_path": audio_path, "start_s": start_s, "end_s": end_s})


def _tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))
    return buffer.getvalue()


def build_shard_from_clips(
    data_root: DataRoot,
    shard_id: str,
    utterances: list[Clip],
    recording: list[Clip] = (),
    *,
    seed: int = 0,
    as_tar: bool = False,
    formats: tuple[str, ...] = ("wav", "flac", "mp3", "opus"),
    with_faults: bool = False,
) -> pa.Table:
    """Land a shard whose every utterance is one distinct clip, so nothing in it repeats by accident.

    ``utterances`` become standalone files ``<shard>_<i:05d>`` in a rotating mix of formats, rates
    and channel counts (never below 16 kHz: narrowband audio is a reject of its own); ``recording``
    (clips of one language) becomes one long FLAC described by one ``start_s``/``end_s`` row per
    clip, ``<shard>_rec000_<k:02d>``. ``with_faults=True`` adds one row for each of
    :data:`FAULT_REASONS`. A clip passed twice lands twice: that is how a caller plants a copy.
    """
    rng = np.random.default_rng(seed)
    files: dict[str, bytes] = {}
    rows: list[dict] = []
    for i, clip in enumerate(utterances):
        fmt = formats[i % len(formats)]
        rate = int(rng.choice([r for r in AUDIO_FORMATS[fmt][2] if r >= 16_000]))
        channels = 2 if i % 3 == 2 else 1
        audio_path = f"{clip.language}/{shard_id}_{i:05d}.{fmt}"
        files[audio_path] = _encode(_render([clip], rng, rate, channels), rate, fmt)
        rows.append(_row(f"{shard_id}_{i:05d}", audio_path, [clip], clip.language, rng, None, None))
    if recording:
        base_rate = recording[0].sample_rate
        gap = np.zeros(int(0.5 * base_rate), np.float32)
        audio_path = f"recordings/{shard_id}_rec000.flac"
        position, pieces = 0.0, []
        for k, clip in enumerate(recording):
            pieces += [gap, clip.samples]
            start_s = position + len(gap) / base_rate
            end_s = start_s + len(clip.samples) / base_rate
            position = end_s
            rows.append(_row(f"{shard_id}_rec000_{k:02d}", audio_path, [clip], clip.language, rng, start_s, end_s))
        pieces.append(gap)
        files[audio_path] = _encode(np.concatenate(pieces), base_rate, "flac")
    return _land(data_root, shard_id, files, rows, rng, with_faults=with_faults, as_tar=as_tar, complete=True)


def _land(
    data_root: DataRoot, shard_id: str, files: dict, rows: list, rng, *, with_faults: bool, as_tar: bool, complete: bool
) -> pa.Table:
    """Write a sample shard's audio (loose files or one tar) and metadata, faulty rows added if asked;
    ``complete``: then its ``_SUCCESS`` marker."""
    if with_faults:
        _add_faults(shard_id, files, rows, rng)
    if as_tar:
        data_root.write_bytes(layout.landing_audio_tar(shard_id), _tar_bytes(files))
    else:
        for path, data in files.items():
            data_root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{path}", data)
    table = pa.Table.from_pylist(rows, schema=SAMPLE_METADATA_SCHEMA)
    data_root.write_parquet(layout.landing_metadata(shard_id), table)
    if complete:
        mark_landed(data_root, shard_id)
    return table
