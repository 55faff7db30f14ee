"""Re-landing detection cost: a shard's content fingerprint against hashing every byte it holds.

Why: the landing sensor fingerprints a shard whenever its ``_SUCCESS`` or ``metadata.parquet``
changed identity, inside Dagster's sensor timeout. The fingerprint hashes the small files and
lists the audio (names and sizes; tar member headers only); the baseline hashes every byte of the
shard, the only way to see audio rewritten in place with the same name and size. Both run on the
same shard, one ``audio/`` folder and one ``audio.tar`` of ``--files`` three-second 24 kHz WAVs,
with the files in the page cache (a warm-up pass first), median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import tarfile
import tempfile

import numpy as np
import pyarrow as pa
import soundfile as sf

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.fingerprint import shard_content_fingerprint


def wav_bytes(seconds: float, seed: int) -> bytes:
    samples = np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * 24_000)).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, samples, 24_000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def land(root: DataRoot, shard_id: str, files: int, as_tar: bool) -> None:
    audio = {f"utt_{n:06d}.wav": wav_bytes(3.0, n) for n in range(files)}
    if as_tar:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, data in audio.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        root.write_bytes(layout.landing_audio_tar(shard_id), buffer.getvalue())
    else:
        for name, data in audio.items():
            root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{name}", data)
    rows = [{"utt_id": name.removesuffix(".wav"), "audio_path": name, "text": "a b c"} for name in audio]
    root.write_parquet(layout.landing_metadata(shard_id), pa.Table.from_pylist(rows))
    root.write_bytes(layout.landing_success_marker(shard_id), b"landing-1")


def hash_every_byte(root: DataRoot, shard_id: str) -> str:
    digest = hashlib.sha256()
    folder = root.path(layout.landing_dir(shard_id))
    for parent, folders, names in os.walk(folder):
        folders.sort()
        for name in sorted(names):
            with open(os.path.join(parent, name), "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 files, 2 repeats")
    parser.add_argument("--files", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.repeats = 100, 2
    figures: dict = {}
    with stdout_to_stderr(), tempfile.TemporaryDirectory() as tmp:
        root = DataRoot(tmp)
        for layout_name, as_tar in (("folder", False), ("tar", True)):
            shard_id = f"bench-{layout_name}"
            land(root, shard_id, args.files, as_tar)
            fingerprint_s = timed(
                lambda s=shard_id: shard_content_fingerprint(root, s), args.repeats, warm_up=True
            ).median_s
            every_byte_s = timed(lambda s=shard_id: hash_every_byte(root, s), args.repeats, warm_up=True).median_s
            progress(f"{layout_name}: fingerprint {fingerprint_s * 1e3:.1f} ms, every byte {every_byte_s * 1e3:.1f} ms")
            figures[f"{layout_name}_fingerprint_ms"] = round(fingerprint_s * 1e3, 2)
            figures[f"{layout_name}_every_byte_ms"] = round(every_byte_s * 1e3, 2)
            figures[f"{layout_name}_ratio_fingerprint_over_every_byte"] = ratio(fingerprint_s, every_byte_s)
        figures["shard_mb"] = round(args.files * len(wav_bytes(3.0, 0)) / 1e6, 1)
    emit("landing_fingerprint", {"quick": args.quick, "files": args.files, "repeats": args.repeats}, figures)


if __name__ == "__main__":
    main()
