"""The one timing and report helper every benchmark uses.

Reporting: each benchmark prints one JSON line on stdout, and nothing else there. Libraries (Dagster's
loggers, libsndfile's decoders, worker processes) may write to stdout, so each benchmark runs its
measurements inside :func:`stdout_to_stderr` and then :func:`emit`\\s its record, with figures beside
their baseline as a :func:`ratio`.

Timing: wall-clock is ``time.perf_counter``, CPU time ``time.process_time`` (pass ``clock=``);
:func:`timed` repeats a call and keeps the median, :func:`alternating_medians` times two builds in
alternating order so drift in the machine's load falls on both, :class:`Stopwatch` times a block.

Memory: :func:`peak_rss_mb` is this address space's peak (``VmHWM``): ``ru_maxrss`` survives ``exec``
on Linux, so a child started by a large parent would report the parent's peak. :class:`RssSampler`
samples the resident size while a block runs (its peak, and what the block added);
:class:`RssKindsSampler` splits it into anonymous and file-backed memory, with the page faults and
bytes read of the block.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

if TYPE_CHECKING:
    import torch


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr while the block runs (Python, C code and child processes)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def ratio(value: float, baseline: float) -> float | None:
    """``value / baseline`` to four significant digits (None without a baseline)."""
    return float(f"{value / baseline:.4g}") if baseline else None


def machine() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def emit(benchmark: str, params: dict, figures: dict) -> None:
    """Print ``{"benchmark", "params", "machine", **figures}`` as one JSON line."""
    record = {"benchmark": benchmark, "params": params, "machine": machine(), **figures}
    print(json.dumps(record, sort_keys=False), flush=True)


def leave_measured() -> NoReturn:
    """End a measurement child once its figures are written, without interpreter teardown.

    Arrow's parquet threads can abort a finished process at exit (``terminate called without an
    active exception``, apache/arrow#34314), which would discard figures already printed; a child
    measures the work, not the teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# Time


class Timing(NamedTuple):
    median_s: float
    first_s: float
    """The first timed call alone: a cold cache or a first-call set-up shows here, not in the median."""
    result: Any
    """What the last call returned."""


def timed(
    fn: Callable[[], Any], repeats: int = 1, *, warm_up: bool = False, clock: Callable[[], float] = time.perf_counter
) -> Timing:
    """``repeats`` calls of ``fn`` (after one untimed call with ``warm_up``): the median, the first, the result."""
    result = fn() if warm_up else None
    seconds = []
    for _ in range(repeats):
        started = clock()
        result = fn()
        seconds.append(clock() - started)
    return Timing(statistics.median(seconds), seconds[0], result)


def timed_call(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> tuple[float, Any]:
    """One call of ``fn``: its seconds and what it returned."""
    started = clock()
    result = fn()
    return clock() - started, result


def alternating_medians(
    first: Callable[[], Any], second: Callable[[], Any], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, float]:
    """Median seconds of ``first`` and of ``second``, called in turn, the order swapped every repeat."""
    seconds: tuple[list[float], list[float]] = ([], [])
    for repeat in range(repeats):
        for which in (0, 1) if repeat % 2 == 0 else (1, 0):
            seconds[which].append(timed_call((first, second)[which], clock)[0])
    return statistics.median(seconds[0]), statistics.median(seconds[1])


def median_by_key(passes: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the median over passes that each measured the same keys."""
    return {key: statistics.median(p[key] for p in passes) for key in passes[0]}


class Stopwatch:
    """Wall-clock and CPU seconds of a block: ``with Stopwatch() as watch: ...`` then ``watch.wall_s``."""

    wall_s: float = 0.0
    cpu_s: float = 0.0

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> bool:
        self.wall_s, self.cpu_s = time.perf_counter() - self._wall, time.process_time() - self._cpu
        return False


def process_cpu_seconds() -> float:
    """User plus system CPU seconds this process has used (its threads included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ForwardTimer:
    """Sums wall time inside ``model.forward`` (hooks run inside ``__call__`` around ``forward``).

    ``synchronize`` (e.g. ``torch.cuda.synchronize``) is called at both ends, so that on an
    asynchronous device the forward's kernels are counted in it and nothing before it is.
    """

    def __init__(self, model: torch.nn.Module, synchronize: Callable[[], None] | None = None):
        self.seconds, self.calls, self._started = 0.0, 0, 0.0
        self._synchronize = synchronize or (lambda: None)
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)

    def _pre(self, module, args) -> None:
        self._synchronize()
        self._started = time.perf_counter()

    def _post(self, module, args, output) -> None:
        self._synchronize()
        self.seconds += time.perf_counter() - self._started
        self.calls += 1

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def timed_pass(self, run: Callable[[], object]) -> dict[str, float]:
        """One call of ``run``: its wall seconds, and the seconds and calls inside ``forward``."""
        self.reset()
        total, _ = timed_call(run)
        return {"total_s": total, "forward_s": self.seconds, "forwards": self.calls}


# Memory


def peak_rss_mb() -> float:
    """This address space's peak resident memory (``VmHWM``), in MiB."""
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no procfs: may include the parent's


def children_peak_rss_mb() -> float:
    """The largest peak resident memory among this process's reaped children (``RUSAGE_CHILDREN``), MiB."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def resident_mb() -> float:
    """This process's resident memory now (``/proc/self/statm``), in MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssSampler:
    """The process's peak resident memory while the block ran, and how much of it the block added,
    sampled every 20 ms from ``/proc/self/statm`` (so a block in a process that was larger before it
    still shows its own peak)."""

    def __init__(self, interval_s: float = 0.02):
        self.interval_s, self.added_mb, self.peak_mb = interval_s, 0.0, 0.0

    resident_mb = staticmethod(resident_mb)

    def __enter__(self) -> RssSampler:
        self._start, self._stop = resident_mb(), threading.Event()
        self._peak = self._start
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._peak = max(self._peak, resident_mb())

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self._peak, resident_mb())
        self.added_mb = self.peak_mb - self._start
        return False


def _status_kib(*fields: str) -> dict[str, int]:
    """``fields`` of ``/proc/self/status`` (kB values), 0 where the kernel does not report one."""
    found = dict.fromkeys(fields, 0)
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in found:
                found[name] = int(value.split()[0])
    return found


class RssKindsSampler:
    """Anonymous and file-backed resident memory while a block runs (``RssAnon`` / ``RssFile`` of
    ``/proc/self/status``, every 10 ms): each one's peak, both at the peak of their sum, and the minor
    and major page faults and bytes read (``/proc/self/io``: ``rchar`` every read and pread,
    ``read_bytes`` what reached the disk) the block caused. Tells memory a process holds from file
    pages it maps (a memory map's pages count in RSS as file-backed, reclaimable memory)."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s
        self.figures: dict[str, float] = {}

    @staticmethod
    def _io() -> dict[str, int]:
        try:
            with open("/proc/self/io") as io:
                return {name: int(value) for name, _, value in (line.partition(": ") for line in io)}
        except OSError:  # no /proc/self/io (kernel without task I/O accounting)
            return {}

    def _sample(self) -> None:
        while True:
            now = _status_kib("RssAnon", "RssFile")
            self._anon, self._file = max(self._anon, now["RssAnon"]), max(self._file, now["RssFile"])
            if now["RssAnon"] + now["RssFile"] > sum(self._at_peak):
                self._at_peak = (now["RssAnon"], now["RssFile"])
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> RssKindsSampler:
        start = _status_kib("RssAnon", "RssFile")
        self._start_anon, self._start_file = start["RssAnon"], start["RssFile"]
        self._anon, self._file, self._at_peak = self._start_anon, self._start_file, (0, 0)
        self._usage, self._io_start = resource.getrusage(resource.RUSAGE_SELF), self._io()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join()
        usage, io = resource.getrusage(resource.RUSAGE_SELF), self._io()
        self.figures = {
            "rss_anon_start_mb": round(self._start_anon / 1024, 1),
            "rss_file_start_mb": round(self._start_file / 1024, 1),
            "rss_anon_peak_mb": round(self._anon / 1024, 1),
            "rss_file_peak_mb": round(self._file / 1024, 1),
            "rss_anon_at_peak_mb": round(self._at_peak[0] / 1024, 1),
            "rss_file_at_peak_mb": round(self._at_peak[1] / 1024, 1),
            "minor_faults": usage.ru_minflt - self._usage.ru_minflt,
            "major_faults": usage.ru_majflt - self._usage.ru_majflt,
        }
        for name in ("rchar", "read_bytes"):
            if name in io and name in self._io_start:
                self.figures[f"io_{name}_mb"] = round((io[name] - self._io_start[name]) / 2**20, 1)
        return False
