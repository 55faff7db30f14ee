"""What the GPU workers' write fence costs a shard's writes: fenced against unfenced, same worker.

Why: a resident worker checks its attempt's fence (one small read) before every file it moves into
place, so the stage with the most files per shard pays the most: alignments writes two CTM files
per utterance beside its parquet files. Both arms write that shard (``--utterances`` utterances,
a word and a token CTM each, then the alignments parquet) through one ``ShardWorker`` under a held
step lock: the baseline with no fence, as the ``local`` engine runs, the other with the attempt's
fence, as the ``ray`` engine runs. On a local root and on S3 (moto's server on loopback, in this
process: a request costs far less than on a real bucket, so the S3 ratio is an upper bound on the
share of time the check takes there). Median of ``--repeats``, arms interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile

import pyarrow as pa

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call
from resources.gpu_worker import ShardJob, ShardWorker
from speechdata.io import layout
from speechdata.io.shard_lock import held_fence, shard_write_lock
from speechdata.io.storage import DataRoot

SHARD = "fenced"
PRODUCT = "alignments"
CTM_BYTES = b"utt 1 0.080 0.240 hello 1.0\n" * 8


def write_alignment_like_shard(root: DataRoot, utterances: int) -> None:
    for n in range(utterances):
        utt_id = f"utt_{n:06d}"
        root.write_bytes(layout.ctm(SHARD, "words", utt_id), CTM_BYTES)
        root.write_bytes(layout.ctm(SHARD, "tokens", utt_id), CTM_BYTES)
    table = pa.table({"utt_id": [f"utt_{n:06d}" for n in range(utterances)], "score": [0.5] * utterances})
    root.write_parquet(layout.alignments(SHARD), table)


def shard_seconds(root: DataRoot, utterances: int, fenced: bool) -> float:
    job = ShardJob(
        model_key="none",
        load_model=lambda: None,
        read_inputs=lambda shard_id: None,
        inputs_current=lambda inputs: True,
        run=lambda model, shard_id, inputs, on_progress: write_alignment_like_shard(root, utterances),
    )
    worker = ShardWorker("bench")
    with shard_write_lock(root, SHARD, PRODUCT, run_id="bench"):
        fence = held_fence(SHARD).next_attempt() if fenced else None
        return timed_call(lambda: worker.run_shard(job, SHARD, fence=fence))[0]


def measure(root: DataRoot, utterances: int, repeats: int) -> dict:
    shard_seconds(root, utterances, fenced=True)  # warm-up: folders exist, files are replaced as on a re-run
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for fenced in (False, True):
            times[fenced].append(shard_seconds(root, utterances, fenced))
    unfenced, fenced = statistics.median(times[False]), statistics.median(times[True])
    files = 2 * utterances + 1
    return {
        "files_per_shard": files,
        "unfenced_ms_per_shard": round(unfenced * 1000, 1),
        "fenced_ms_per_shard": round(fenced * 1000, 1),
        "fence_ms_per_file": round((fenced - unfenced) * 1000 / files, 3),
        "ratio_fenced_over_unfenced": ratio(fenced, unfenced),
    }


@contextlib.contextmanager
def loopback_bucket():
    """A bucket on moto's S3 server on 127.0.0.1, the credentials in this process's environment."""
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = dict(os.environ)
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        }
    )
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir("bench-write-fence")
        yield "s3://bench-write-fence/root"
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utterances", type=int, default=1000, help="utterances per shard (two CTM files each)")
    parser.add_argument("--s3-utterances", type=int, default=50, help="utterances per shard on the S3 root")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes")
    args = parser.parse_args(argv)
    if args.quick:
        args.utterances, args.s3_utterances, args.repeats = 50, 10, 1
    with stdout_to_stderr():
        with tempfile.TemporaryDirectory() as folder:
            progress(f"local root: {args.utterances} utterances, {args.repeats} repeats")
            local = measure(DataRoot(f"{folder}/root"), args.utterances, args.repeats)
        with loopback_bucket() as bucket:
            progress(f"S3 root (moto on loopback): {args.s3_utterances} utterances")
            s3 = measure(DataRoot(bucket), args.s3_utterances, args.repeats)
    emit(
        "write_fence",
        {"utterances": args.utterances, "s3_utterances": args.s3_utterances, "repeats": args.repeats},
        {"local": local, "s3_loopback": s3},
    )


if __name__ == "__main__":
    main()
