"""NeMo ASR manifests of the published samples: tarred (NeMo's own convention) or plain.

Tarred (default), as NeMo's ``convert_to_tarred_audio_dataset.py`` lays it out::

    DIR/audio_0.tar ... audio_<N-1>.tar            WAV members only, named <shard>__<key>.wav
    DIR/tarred_audio_manifest.json                 every line, with its shard_id (the tar number)
    DIR/sharded_manifests/manifest_0.json ...      the lines of tar n, for shard_manifests / Lhotse

Each line: ``audio_filepath`` (the member name, which is how ``TarredAudioToCharDataset`` and
``LazyNeMoTarredIterator`` find it), ``duration`` (s), ``text``, ``lang``, ``shard_id``, plus
``source_shard``, ``source_key`` and ``alignment_score``. Plain (``tarred=False``)::

    DIR/manifest.json                              audio_filepath = audio/<shard>/<key>.wav
    DIR/audio/<shard>/<key>.wav

NeMo resolves a relative ``audio_filepath`` against the manifest's directory
(``nemo.collections.common.parts.preprocessing.manifest.get_full_path``), so the directory can be
moved as a whole. The audio is the bridge tar's WAV (24 kHz mono 16-bit) copied byte for byte;
NeMo resamples to the model's rate when it loads it.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from speechdata.export.output import ExportError, Progress, staged_directory, write_record
from speechdata.export.selection import SampleFilter, iter_published_samples, select_published_samples
from speechdata.io.storage import DataRoot

TARRED_MANIFEST = "tarred_audio_manifest.json"
PLAIN_MANIFEST = "manifest.json"
DEFAULT_SAMPLES_PER_TAR = 1000


@dataclass(frozen=True)
class NemoExport:
    out_dir: str
    samples: int
    audio_s: float
    tars: int
    manifest: str


def _line(sample, audio_filepath: str, shard_number: int | None) -> dict:
    row = sample.row
    line = {
        "audio_filepath": audio_filepath,
        "duration": row["duration_s"],
        "text": row["text"] or "",
        "lang": row["language"],
    }
    if shard_number is not None:
        line["shard_id"] = shard_number
    line.update(source_shard=sample.shard, source_key=sample.key, alignment_score=row["alignment_score"])
    # Manifests written before text sources existed have none: their text is the landed one.
    line.update(text_source=row["text_source"] or "landed", asr_confidence=row["asr_confidence"])
    return line


def export_nemo(
    root: DataRoot,
    out_dir: str,
    selection: SampleFilter = SampleFilter(),
    *,
    tarred: bool = True,
    samples_per_tar: int = DEFAULT_SAMPLES_PER_TAR,
    progress: bool = True,
) -> NemoExport:
    """Write the selected samples as a NeMo dataset in ``out_dir`` (replaced atomically)."""
    if isinstance(samples_per_tar, bool) or not isinstance(samples_per_tar, int) or samples_per_tar < 1:
        raise ValueError(f"samples_per_tar must be a positive integer, got {samples_per_tar!r}")
    selected = select_published_samples(root, selection)
    if selected.num_rows == 0:
        raise ExportError(f"no published sample in {root.url} matches {selection.as_dict()}")
    meter = Progress("export nemo", selected.num_rows, interval_s=1.0 if progress else float("inf"))
    with staged_directory(out_dir) as staging:
        lines: list[dict] = []
        if tarred:
            tars = _write_tarred(root, selected, staging, samples_per_tar, lines, meter)
            manifest = TARRED_MANIFEST
        else:
            tars = 0
            for sample in iter_published_samples(root, selected):
                relative = f"audio/{sample.shard}/{sample.key}.wav"
                target = staging / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(sample.members["wav"])
                lines.append(_line(sample, relative, None))
                meter.advance(sample.row["duration_s"])
            manifest = PLAIN_MANIFEST
        _write_jsonl(staging / manifest, lines)
        audio_s = sum(line["duration"] for line in lines)
        write_record(
            staging,
            {
                "format": "nemo-tarred" if tarred else "nemo",
                "data_root": root.url,
                "selection": selection.as_dict(),
                "samples": len(lines),
                "audio_hours": audio_s / 3600,
                "tars": tars,
                "manifest": manifest,
            },
        )
    if progress:
        meter.done()
    return NemoExport(str(Path(out_dir).absolute()), len(lines), audio_s, tars, manifest)


def _write_tarred(root, selected, staging: Path, samples_per_tar: int, lines: list, meter: Progress) -> int:
    seen: set[str] = set()
    (staging / "sharded_manifests").mkdir()
    number, in_tar, tar, shard_lines = 0, 0, None, []

    def close_tar():
        tar.close()
        _write_jsonl(staging / "sharded_manifests" / f"manifest_{number}.json", shard_lines)

    for sample in iter_published_samples(root, selected):
        member = f"{sample.export_id}.wav"
        if member in seen:
            raise ExportError(f"two samples map to the member name {member!r}: rename one shard or key")
        seen.add(member)
        if tar is not None and in_tar >= samples_per_tar:
            close_tar()
            number, in_tar, tar, shard_lines = number + 1, 0, None, []
        if tar is None:
            # One tar spans many samples of this loop; close_tar() closes it when it is full.
            tar = tarfile.open(staging / f"audio_{number}.tar", mode="w", format=tarfile.GNU_FORMAT)  # noqa: SIM115
        data = sample.members["wav"]
        info = tarfile.TarInfo(member)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        line = _line(sample, member, number)
        lines.append(line)
        shard_lines.append(line)
        in_tar += 1
        meter.advance(sample.row["duration_s"])
    if tar is not None:
        close_tar()
        number += 1
    return number


def _write_jsonl(path: Path, lines: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
