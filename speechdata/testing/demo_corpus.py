"""The demo's sample corpus: distinct synthesized sentences landed in every form the importers take.

The clips are ``tests/fixtures/demo_speech`` (espeak-ng, en/de/fr/es, several voices, variants and
speeds; ``generate.py`` there made them, nothing here needs espeak). Every clip is spoken once in the
whole corpus, so near duplicates and defects exist only where :func:`land_demo_corpus` plants them,
and each plant is returned by name (:class:`Planted`) for the demo to print and check.

Forms landed (docs/landing-contract.md):

- ``demo-0001``: plain files (WAV, FLAC, MP3, Ogg/Opus; 16-48 kHz; mono and stereo) plus one long
  recording described by ``start_s``/``end_s`` segments;
- ``demo-0002``: the same kinds of audio in ``audio.tar``, one planted copy of a ``demo-0001``
  utterance (re-encoded, quieter) and one row for each of :data:`~speechdata.testing.shards.FAULT_REASONS`;
- aligned-JSON countries ``de`` and ``fr``: long recordings with per-segment ``human_text``,
  ``asr_text`` (lightly perturbed) and ``cer``; each recording ends with one planted segment under 3 s;
- ``granary-en-000001``: a Granary-style parquet (audio bytes + transcript per row);
- ``segments-en-000001``: an ASR segment-tar shard (metadata, audio index, one FLAC tar);
- ``lid-000001``: a mixed-language tar with a language index.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf

from speechdata.importers.aligned_json import import_aligned_countries
from speechdata.importers.granary import import_granary_parquet
from speechdata.importers.language_tars import import_language_tar
from speechdata.importers.segment_tars import import_segment_tar_shard
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.aligned_json import build_aligned_json_from_clips
from speechdata.testing.shards import FAULT_REASONS, Clip, build_shard_from_clips

DEMO_SPEECH_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "demo_speech"

PLAIN_SHARD = "demo-0001"
TAR_SHARD = "demo-0002"
GRANARY_SHARD = "granary-en-000001"
SEGMENT_TAR_SHARD = "segments-en-000001"
LANGUAGE_TAR_PREFIX = "lid"
ALIGNED_JSON_COUNTRIES = ("de", "fr")
SHORT_SEGMENT_S = 2.0
"""Clips under this are the planted ``too_short`` segments (the HF dataset keeps 3 s and up)."""


@dataclass(frozen=True)
class Planted:
    """A defect put into the corpus on purpose: ``shard``/``utt_id`` must be rejected ``reason``."""

    shard: str
    utt_id: str
    reason: str
    detail: str

    def describe(self) -> str:
        return f"planted: {self.shard}/{self.utt_id} {self.reason} ({self.detail})"


@dataclass
class DemoCorpus:
    shards: list[str]
    """Every landed shard, in the order they were landed."""
    countries: list[str]
    """The aligned-JSON countries (HF dataset partitions)."""
    planted: list[Planted] = field(default_factory=list)
    languages: list[str] = field(default_factory=list)


def load_demo_clips(directory: Path = DEMO_SPEECH_DIR) -> list[Clip]:
    clips = []
    for entry in json.loads((directory / "manifest.json").read_text()):
        samples, rate = sf.read(directory / entry["file"], dtype="float32")
        clips.append(Clip(entry["utt_id"], entry["language"], entry["text"], samples, rate, entry["voice"]))
    return clips


class _Pool:
    """Hands out each language's clips in order, each at most once."""

    def __init__(self, clips: list[Clip]):
        self._left: dict[tuple[str, bool], list[Clip]] = {}
        for clip in clips:
            short = len(clip.samples) < SHORT_SEGMENT_S * clip.sample_rate
            self._left.setdefault((clip.language, short), []).append(clip)

    def take(self, language: str, n: int, *, short: bool = False) -> list[Clip]:
        left = self._left.get((language, short), [])
        if len(left) < n:
            raise ValueError(f"the demo corpus needs {n} more {language!r} clips, {len(left)} are left")
        taken, self._left[(language, short)] = left[:n], left[n:]
        return taken


def _interleave(*groups: list[Clip]) -> list[Clip]:
    return [clip for row in zip(*groups, strict=True) for clip in row]


def land_demo_corpus(data_root: DataRoot, sources_dir: str, clips: list[Clip] | None = None) -> DemoCorpus:
    """Land every form under ``data_root`` (aligned-JSON and language-tar sources go to ``sources_dir``,
    a local directory, as a corpus delivered beside the platform would) and name what was planted.
    Deterministic: the same clips give the same bytes."""
    pool = _Pool(clips or load_demo_clips())
    planted: list[Planted] = []

    plain = _interleave(pool.take("en", 4), pool.take("de", 4), pool.take("fr", 4))
    build_shard_from_clips(data_root, PLAIN_SHARD, plain, pool.take("en", 3), seed=1)

    copied_index = 3  # an English utterance of demo-0001 (interleaved: en de fr en ...)
    original = plain[copied_index]
    copy = Clip(original.utt_id, original.language, original.text, 0.7 * original.samples, original.sample_rate)
    tar_utterances = _interleave(pool.take("en", 3), pool.take("de", 3), pool.take("fr", 3))
    tar_utterances += pool.take("es", 2) + [copy]
    table = build_shard_from_clips(
        data_root, TAR_SHARD, tar_utterances, pool.take("en", 3), seed=2, as_tar=True, with_faults=True
    )
    copy_id = f"{TAR_SHARD}_{len(tar_utterances) - 1:05d}"
    planted.append(
        Planted(
            TAR_SHARD,
            copy_id,
            "near_duplicate",
            f"of {PLAIN_SHARD}/{PLAIN_SHARD}_{copied_index:05d}: the same clip, 3 dB quieter, another codec",
        )
    )
    fault_ids = [u for u in table["utt_id"].to_pylist() if "fault" in u]
    planted += [
        Planted(TAR_SHARD, utt_id, reason, "a malformed landing row")
        for utt_id, reason in zip(fault_ids, FAULT_REASONS, strict=True)
    ]

    countries_dir = f"{sources_dir}/aligned-json"
    recordings = {
        country: [pool.take(country, 3) + pool.take(country, 1, short=True) for _ in range(2)]
        for country in ALIGNED_JSON_COUNTRIES
    }
    build_aligned_json_from_clips(countries_dir, recordings, seed=3, audio_format="opus")
    import_aligned_countries(countries_dir, data_root, list(ALIGNED_JSON_COUNTRIES))
    # Read back rather than taken from the import's report: a second demo run lands nothing new.
    aligned_shards = sorted(
        PurePosixPath(path).parent.name
        for country in ALIGNED_JSON_COUNTRIES
        for path in data_root.glob(f"{layout.LANDING}/{country}-*/{layout.SUCCESS_MARKER}")
    )
    for shard_id in aligned_shards:
        metadata = data_root.read_parquet(layout.landing_metadata(shard_id), columns=["utt_id", "text"])
        short_texts = {c.text for c in clips_in(recordings) if len(c.samples) < SHORT_SEGMENT_S * c.sample_rate}
        planted += [
            Planted(shard_id, utt_id, "too_short", "a segment under 3 s, which the HF dataset leaves out")
            for utt_id, text in zip(metadata["utt_id"].to_pylist(), metadata["text"].to_pylist(), strict=True)
            if text in short_texts
        ]

    granary_source = f"{sources_dir}/granary/en-000001.parquet"
    _write_granary_parquet(granary_source, pool.take("en", 3))
    import_granary_parquet(data_root, GRANARY_SHARD, granary_source, language="en", country="us")

    segment_source = f"{sources_dir}/segment-tars/{SEGMENT_TAR_SHARD}"
    _write_segment_tar_shard(segment_source, pool.take("en", 3))
    import_segment_tar_shard(segment_source, data_root, SEGMENT_TAR_SHARD, language="en")

    tar_source = f"{sources_dir}/language-tars/000001.tar"
    index_source = f"{sources_dir}/language-tars/lid_index.json"
    mixed = pool.take("en", 3) + pool.take("de", 3) + pool.take("fr", 3) + pool.take("es", 2)
    language_index = _write_language_tar(tar_source, index_source, mixed)
    imported = import_language_tar(data_root, tar_source, language_index, shard_prefix=LANGUAGE_TAR_PREFIX)

    shards = [PLAIN_SHARD, TAR_SHARD, *aligned_shards, GRANARY_SHARD, SEGMENT_TAR_SHARD, imported.shard_id]
    languages = sorted({clip.language for clip in plain + tar_utterances + mixed} | set(ALIGNED_JSON_COUNTRIES))
    return DemoCorpus(shards=shards, countries=list(ALIGNED_JSON_COUNTRIES), planted=planted, languages=languages)


def clips_in(recordings: dict[str, list[list[Clip]]]) -> list[Clip]:
    return [clip for clip_lists in recordings.values() for clips in clip_lists for clip in clips]


def _flac_bytes(clip: Clip) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, clip.samples, clip.sample_rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


def _write_granary_parquet(path: str, clips: list[Clip]) -> None:
    """The translation corpus's ASR parquet: an HF ``Audio`` struct and the transcript per row."""
    table = pa.table(
        {
            "audio": [{"bytes": _flac_bytes(c), "path": f"{c.utt_id}.flac"} for c in clips],
            "text": [c.text for c in clips],
            "duration": [round(len(c.samples) / c.sample_rate, 3) for c in clips],
        }
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _write_segment_tar_shard(directory: str, clips: list[Clip]) -> None:
    """An ASR segment-tar shard: ``metadata.parquet``, ``audio_index.parquet`` and one FLAC tar."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    ids = [f"rec{i // 2:03d}_{i % 2:04d}" for i in range(len(clips))]
    with tarfile.open(f"{directory}/audio.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for segment_id, clip in zip(ids, clips, strict=True):
            data = _flac_bytes(clip)
            info = tarfile.TarInfo(f"{segment_id}.flac")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    metadata = {
        "segment_id": ids,
        "transcription_native": [c.text for c in clips],
        "duration_s": [round(len(c.samples) / c.sample_rate, 3) for c in clips],
        "tx_quality_score": [0.9] * len(clips),
        "segment_language": [c.language for c in clips],
    }
    pq.write_table(pa.table(metadata), f"{directory}/metadata.parquet")
    index = {"segment_id": ids, "tar_member_name": [f"{segment_id}.flac" for segment_id in ids]}
    pq.write_table(pa.table(index), f"{directory}/audio_index.parquet")


def _write_language_tar(tar_path: str, index_path: str, clips: list[Clip]) -> dict[tuple[int, str], str]:
    """A source tar of FLAC members from several languages and its language index (a JSON table)."""
    Path(tar_path).parent.mkdir(parents=True, exist_ok=True)
    entries = []
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i, clip in enumerate(clips):
            data = _flac_bytes(clip)
            info = tarfile.TarInfo(f"sample_{i:04d}.flac")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            entries.append({"tar_number": 1, "filename": f"sample_{i:04d}", "language": clip.language})
    Path(index_path).write_text(json.dumps(entries, indent=1))
    return {(e["tar_number"], e["filename"]): e["language"] for e in entries}


@dataclass
class RejectReport:
    """The corpus's rejects sorted against what was planted (see :func:`sort_rejects`)."""

    landed: int
    """Landed utterances that were not planted."""
    caught: set[Planted]
    """Plants rejected with their reason."""
    by_design: dict[str, int]
    """Utterances per explanation that a product leaves out by its definition, not by a defect."""
    unexpected: list[tuple[str, str, str, str]]
    """``(shard, utt_id, stage, reason)`` of every other reject."""

    @property
    def unexpected_utterances(self) -> int:
        return len({(shard, utt_id) for shard, utt_id, _, _ in self.unexpected})


PSEUDO_LABEL_FILTERS = frozenset(
    {
        "low_asr_confidence",
        "no_words_recognized",
        "transcript_repetition",
        "speaking_rate_too_fast",
        "speaking_rate_too_slow",
    }
)
"""Transcript filters that judge an utterance landed without text by its pseudo-label: the demo's small
and tiny aligners transcribe poorly (the small one at CER ~0.38 on the demo's sentences, the tiny one at
random), so many such labels fail one, as they should."""


def _by_design(reason: str, language: str | None, text: str | None, aligned_languages) -> str | None:
    """Why a product leaves this utterance out by its definition (None when that is not the case)."""
    if reason == "no_aligner_for_language" and language not in aligned_languages:
        return f"no_aligner_for_language: the profile has no CTC model for {language!r}"
    if reason == "empty_transcript" and not text:
        return "empty_transcript: language tars land audio and a language, no transcript (VAD products only)"
    if not text and reason in PSEUDO_LABEL_FILTERS:
        return (
            f"{reason}: a language tar lands no transcript; the profile's aligner transcribed it (a pseudo-label, "
            "text_source asr) and the label failed this transcript filter"
        )
    if reason == "no_segmentation" and language != "en":
        return "no_segmentation: streaming translation takes English speech only"
    return None


def sort_rejects(data_root: DataRoot, corpus: DemoCorpus, aligned_languages) -> RejectReport:
    """Read every reject file of the corpus's shards and sort each reject: a plant caught, one a
    product makes by its definition (:func:`_by_design`; ``aligned_languages``: those the profile
    aligns), or unexpected."""
    planted = {(p.shard, p.utt_id): p for p in corpus.planted}
    caught: set[Planted] = set()
    by_design: dict[str, set[tuple[str, str]]] = {}
    unexpected = []
    landed = 0
    for shard_id in corpus.shards:
        metadata = data_root.read_parquet(layout.landing_metadata(shard_id), columns=["utt_id", "language", "text"])
        landed_rows = {row["utt_id"]: row for row in metadata.to_pylist()}
        landed += sum((shard_id, utt_id) not in planted for utt_id in landed_rows)
        for path in sorted(data_root.glob(f"{layout.rejects_dir(shard_id)}/[!.]*.parquet")):
            stage = PurePosixPath(path).stem
            table = data_root.read_parquet(
                f"{layout.rejects_dir(shard_id)}/{stage}.parquet", columns=["utt_id", "reason"]
            )
            for utt_id, reason in zip(table["utt_id"].to_pylist(), table["reason"].to_pylist(), strict=True):
                plant = planted.get((shard_id, utt_id))
                if plant is not None:
                    if reason == plant.reason:
                        caught.add(plant)
                    continue
                row = landed_rows.get(utt_id, {})
                why = _by_design(reason, row.get("language"), row.get("text"), aligned_languages)
                if why is not None:
                    by_design.setdefault(why, set()).add((shard_id, utt_id))
                else:
                    unexpected.append((shard_id, utt_id, stage, reason))
    return RejectReport(
        landed=landed,
        caught=caught,
        by_design={why: len(utterances) for why, utterances in sorted(by_design.items())},
        unexpected=unexpected,
    )
