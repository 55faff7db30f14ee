"""What confining every path to the data root costs: ``DataRoot.path`` resolving each path (symlinks
included) against a plain join, on the stage with the most files per shard and on a listing.

Why: every read and write under a local root resolves its path (``os.path.realpath``: one ``lstat``
per component) before it is used, and ``DataRoot.glob`` resolves every match. Two arms, interleaved,
median of ``--repeats``: the confined root, and a root whose ``path`` is the join the platform used
before (no check). Workloads: an alignments-like shard (``--utterances`` utterances, a word and a
token CTM each, then a parquet file), and a glob of ``shards/*/utterances.parquet`` over
``--shards`` shard folders. The figure is the ratio confined / unconfined of each.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import pyarrow as pa

from benchmarks.report import alternating_medians, emit, progress, ratio, stdout_to_stderr
from speechdata.io import layout
from speechdata.io.storage import DataRoot, escape_glob

SHARD = "confined"
CTM_BYTES = b"utt 1 0.080 0.240 hello 1.0\n" * 8


class UnconfinedDataRoot(DataRoot):
    """The baseline: paths joined, never resolved or checked."""

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def glob(self, pattern: str) -> list[str]:
        return self.fs.glob(f"{escape_glob(self.root)}/{pattern}")


def write_alignment_like_shard(root: DataRoot, utterances: int) -> None:
    for n in range(utterances):
        utt_id = f"utt_{n:06d}"
        root.write_bytes(layout.ctm(SHARD, "words", utt_id), CTM_BYTES)
        root.write_bytes(layout.ctm(SHARD, "tokens", utt_id), CTM_BYTES)
    table = pa.table({"utt_id": [f"utt_{n:06d}" for n in range(utterances)], "score": [0.5] * utterances})
    root.write_parquet(layout.alignments(SHARD), table)


def glob_shards(root: DataRoot) -> list[str]:
    found = root.glob(layout.utterance_index("*"))
    assert found
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utterances", type=int, default=1000, help="utterances per shard (two CTM files each)")
    parser.add_argument("--shards", type=int, default=5000, help="shard folders the glob lists")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes")
    args = parser.parse_args(argv)
    if args.quick:
        args.utterances, args.shards, args.repeats = 50, 50, 1
    with stdout_to_stderr(), tempfile.TemporaryDirectory() as folder:
        url = f"{folder}/root"
        roots = {True: DataRoot(url), False: UnconfinedDataRoot(url)}
        write_alignment_like_shard(roots[True], args.utterances)  # warm-up: folders exist, files are replaced
        progress(f"alignments-like shard: {args.utterances} utterances, {args.repeats} repeats")
        unconfined_write, confined_write = alternating_medians(
            lambda: write_alignment_like_shard(roots[False], args.utterances),
            lambda: write_alignment_like_shard(roots[True], args.utterances),
            args.repeats,
        )
        for n in range(args.shards):
            path = roots[False].path(layout.utterance_index(f"s{n:06d}"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "wb").close()
        progress(f"glob over {args.shards} shard folders")
        unconfined_glob, confined_glob = alternating_medians(
            lambda: glob_shards(roots[False]), lambda: glob_shards(roots[True]), args.repeats
        )
    files = 2 * args.utterances + 1
    emit(
        "root_confinement",
        {"utterances": args.utterances, "shards": args.shards, "repeats": args.repeats},
        {
            "shard_write": {
                "files_per_shard": files,
                "unconfined_ms_per_shard": round(unconfined_write * 1000, 1),
                "confined_ms_per_shard": round(confined_write * 1000, 1),
                "confinement_us_per_file": round((confined_write - unconfined_write) * 1e6 / files, 2),
                "ratio_confined_over_unconfined": ratio(confined_write, unconfined_write),
            },
            "glob": {
                "unconfined_ms": round(unconfined_glob * 1000, 1),
                "confined_ms": round(confined_glob * 1000, 1),
                "confinement_us_per_match": round((confined_glob - unconfined_glob) * 1e6 / args.shards, 2),
                "ratio_confined_over_unconfined": ratio(confined_glob, unconfined_glob),
            },
        },
    )


if __name__ == "__main__":
    main()
