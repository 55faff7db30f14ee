"""Materialize every per-shard asset of one shard, in a process of its own: the process the crash test kills.

python -m tests.integration.materialize_shard <data_root> <shard_id> <model_cache_dir> [ASSETS]

With ``ASSETS`` (asset keys separated by commas, or ``every-shard-asset`` for every shard-partitioned
asset of the code location: the per-shard job's and the on-demand ones) it materializes those once,
prints ``peak_rss_bytes=N`` (the kernel's high-water mark of resident memory: this process's, or a
worker's it started if larger) and exits with 0 or 1. Without, it imports Dagster, torch and the code location once, then serves runs: for each line
``<kill_point or -> <log_path>`` on stdin it forks a child that materializes the shard (its stdout
and stderr go to ``log_path``), waits for it, and answers with the child's exit status on stdout as
``subprocess`` reports it (``-9`` for a SIGKILL). Each run is thus a separate process killed by a
real SIGKILL, started from the same freshly imported state, without paying the imports again.
"""

import os
import resource
import signal
import sys

import dagster as dg

from assets import ON_DEMAND_SHARD_ASSETS, SHARD_ASSETS
from assets.partitions import shard_partitions
from speechdata.io.faults import KILL_AT_ENV
from tests.tiny_resources import tiny_resources_for

EVERY_SHARD_ASSET = "every-shard-asset"


def selected(names: str | None) -> list:
    if names is None:
        return SHARD_ASSETS
    everything = SHARD_ASSETS + ON_DEMAND_SHARD_ASSETS
    if names == EVERY_SHARD_ASSET:
        return everything
    wanted = set(names.split(","))
    return [asset for asset in everything if asset.key.to_user_string() in wanted]


def materialize(root: str, shard_id: str, model_cache_dir: str, names: str | None = None) -> int:
    resources = tiny_resources_for(root, model_cache_dir)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
        result = dg.materialize(selected(names), partition_key=shard_id, instance=instance, resources=resources)
    return 0 if result.success else 1


def run_in_child(root: str, shard_id: str, model_cache_dir: str, kill_at: str | None, log_path: str) -> int:
    """Fork, materialize in the child (killed at ``kill_at`` if given), and return its exit status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.environ.pop(KILL_AT_ENV, None)
            if kill_at:
                os.environ[KILL_AT_ENV] = kill_at
            code = materialize(root, shard_id, model_cache_dir)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def import_model_libraries() -> None:
    """What the runs import lazily (the code location does not import them): imported here once, every
    forked run starts with them. Nothing is loaded or run, so no thread pool exists yet to be lost by
    the fork."""
    import torch  # noqa: F401
    import torchaudio  # noqa: F401
    from transformers import AutoTokenizer, Qwen3Model, Wav2Vec2ForSequenceClassification, WavLMModel  # noqa: F401


def serve(root: str, shard_id: str, model_cache_dir: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    import_model_libraries()
    for line in sys.stdin:
        kill_at, log_path = line.split()
        code = run_in_child(root, shard_id, model_cache_dir, None if kill_at == "-" else kill_at, log_path)
        print(code, flush=True)
    # Nothing is left to flush or close: skip the interpreter's teardown of torch and the code location.
    os._exit(0)


PEAK_RSS_PREFIX = "peak_rss_bytes="


def peak_resident_bytes() -> int:
    """The largest resident high-water mark of this process and the workers it has waited for (Linux
    reports ``ru_maxrss`` in KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, workers) * 1024


if __name__ == "__main__":
    if len(sys.argv) > 4:
        code = materialize(*sys.argv[1:5])
        print(f"{PEAK_RSS_PREFIX}{peak_resident_bytes()}", flush=True)
        sys.exit(code)
    serve(*sys.argv[1:4])
