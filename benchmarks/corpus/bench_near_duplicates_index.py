"""Near duplicates per new shard against a corpus index of N shards: wall, CPU and peak RSS, against
the whole-index scan it replaced, at two N.

Why: every landed shard is checked against everything indexed before it. The earlier design read
every entries file of the index, parsed every utterance and built a lookup over every key for each
new shard, so a shard cost grew with the corpus (issue figures: 118 s and 12.7 GB at 1 000 h). The
index keyed by postings (speechdata.quality.near_dup_index) looks up only the new shard's keys and
fetches only the candidates they name. The baseline, in the same run on the same index: read and
parse every entries file of the index, build the in-memory candidate source over all of it and
decide the shard (:class:`~speechdata.quality.near_dup_matching.MemorySource`: what the earlier
design did per shard). The new path: reserve a position, read the postings of the shard's keys and
the entries they name, decide, commit (entries file, level-0 segment, order row) and compact.

The index is synthetic (signals, not audio: fingerprinting costs the same in both designs and is
per utterance): N shards of ``--utterances`` utterances of 3.2-6.4 s (random sub-fingerprints, 85 %
of frames active, 8-word transcripts' MinHash, a speaker embedding, a loudness envelope and spectral
shape with their 276 envelope band-pair keys); the new shard holds as many utterances, a tenth of them copies
of earlier utterances (5 % of frames with one bit flipped, the same transcript and speaker, the
envelope with noise). Each
measurement runs in a fresh process; peak RSS is that process's high-water mark, ``added`` the part
above what the process held after its imports.
"""

from __future__ import annotations

import argparse
import inspect
import multiprocessing
import resource
import secrets
import statistics
import tempfile
import time

import numpy as np

from benchmarks.report import emit, progress, ratio, resident_mb, stdout_to_stderr

FRAMES = (200, 400)


def _unit(vector: np.ndarray) -> np.ndarray:
    return (vector / np.linalg.norm(vector)).astype(np.float16).astype(np.float32)


def synthetic_shift(rng: np.random.Generator, like=None):
    """A loudness envelope, spectral shape and speech span (random; a copy's: the original's envelope
    with noise, its shape and span)."""
    from speechdata.quality.fingerprint_envelope import ENVELOPE_POINTS, SHAPE_SEGMENTS, ShiftSignature

    if like is not None:
        return ShiftSignature(
            _unit(like.envelope + rng.normal(0, 0.03, ENVELOPE_POINTS)), like.spectral_shape, like.span_s
        )
    return ShiftSignature(
        _unit(rng.standard_normal(ENVELOPE_POINTS)),
        rng.integers(-60, 60, (SHAPE_SEGMENTS, 52)).astype(np.int8),
        float(rng.uniform(2.5, 6.0)),
    )


def synthetic_signals(shard_id: str, count: int, rng: np.random.Generator, copies_of=None):
    from speechdata.quality.fingerprint_audio import AudioFingerprint
    from speechdata.quality.near_dup_matching import UtteranceSignals

    made = []
    for number in range(count):
        utt_id = f"{shard_id}-{number:05d}"
        if copies_of and number % 10 == 0:
            original = copies_of[int(rng.integers(len(copies_of)))]
            values = original.fingerprint.sub_fingerprints.copy()
            flipped = rng.random(len(values)) < 0.05
            values[flipped] ^= np.uint32(1) << rng.integers(0, 32, flipped.sum()).astype(np.uint32)
            made.append(
                UtteranceSignals(
                    shard_id,
                    utt_id,
                    None,
                    AudioFingerprint(values, original.fingerprint.active.copy()),
                    original.transcript_signature,
                    original.transcript_words,
                    original.speaker_embedding,
                    synthetic_shift(rng, original.shift) if original.shift is not None else None,
                )
            )
            continue
        frames = int(rng.integers(*FRAMES))
        made.append(
            UtteranceSignals(
                shard_id,
                utt_id,
                secrets.token_hex(32),
                AudioFingerprint(rng.integers(0, 2**32, frames, dtype=np.uint32), rng.random(frames) < 0.85),
                rng.integers(0, 2**63, 128, dtype=np.uint64),
                8,
                _unit(rng.standard_normal(256)),
                synthetic_shift(rng),
            )
        )
    return made


def build_index(url: str, shards: int, utterances: int) -> None:
    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_dup_index import write_index
    from speechdata.quality.near_dup_matching import Decision

    rng = np.random.default_rng(shards)

    def corpus():
        # One shard's signals at a time: a 10 000-hour index does not fit in memory at once.
        for number in range(shards):
            shard_id = f"s{number:06d}"
            signals = synthetic_signals(shard_id, utterances, rng)
            yield shard_id, signals, [Decision(s.utt_id, shard_id, s.utt_id, None, 1.0) for s in signals]

    write_index(DataRoot(url), corpus())


def _new_shard(url: str, utterances: int, shard_id: str = "new", seed: int = 7):
    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_dup_index import read_order, read_shard_entries

    root = DataRoot(url)
    order = read_order(root)
    rng = np.random.default_rng(seed)
    earlier = [signals for signals, _ in read_shard_entries(root, order[int(rng.integers(len(order)))])]
    return root, synthetic_signals(shard_id, utterances, rng, copies_of=earlier)


def measure(url: str, utterances: int, path: str, results) -> None:
    """One new shard through ``path`` against the index at ``url``, in this (fresh) process: wall, CPU,
    peak RSS and its anonymous / file-backed split, page faults, bytes read (the reader's own counts of
    segment and filter bytes, and the process's ``rchar``), postings and entries rows read, and the
    live segments' sizes. ``SPEECHDATA_BENCH_PROFILE_DIR``: the measured block profiled (cProfile) into
    ``<dir>/near_duplicates-<path>-<indexed shards>.prof``."""
    import cProfile
    import os

    from benchmarks.report import RssKindsSampler
    from speechdata.quality.near_dup_index import (
        IndexReader,
        compact_index,
        read_order,
        read_shard_entries,
        reserve_position,
        wait_for_earlier,
    )
    from speechdata.quality.near_dup_matching import MemorySource, NearDuplicateThresholds, decide_shard

    root, signals = _new_shard(url, utterances)
    thresholds = NearDuplicateThresholds()
    _warm_up(url)
    sizes = _segment_sizes(url)
    profile_folder = os.environ.get(PROFILE_ENV)
    profiler = cProfile.Profile() if profile_folder else None
    after_imports = resident_mb()
    reader = None
    with RssKindsSampler() as kinds:
        wall, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        if path == "baseline_whole_index":
            indexed = [entry for shard in read_order(root) for entry in read_shard_entries(root, shard)]
            source = MemorySource(indexed)
            decisions = decide_shard(source.next_position, signals, source, thresholds)
            touched, postings_read = len(indexed), None
        else:
            with IndexLockTimes() as lock_times:
                with reserve_position(root, "new") as reservation:
                    reader = IndexReader(root, reservation.position, wait_for_earlier(root, reservation))
                    decisions = _decided_and_committed(root, reservation, signals, reader, thresholds)
                compact_index(root)
            touched, postings_read = reader.rows_read, reader.postings_read
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if profiler is not None:
        profiler.dump_stats(os.path.join(profile_folder, f"near_duplicates-{path}-{indexed_shards(url)}.prof"))
    figures = {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "added_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - after_imports, 1),
        **kinds.figures,
        "copies_found": sum(1 for d in decisions if d.kind),
        "indexed_utterances_read": touched,
        # What the lookup found in the segments: the postings its keys hit, chance hits included.
        "postings_read": postings_read,
    }
    if reader is not None:
        figures.update(_reader_figures(reader, sizes))
        figures["lock_held_ms"] = lock_times.figures()
    results[path] = figures


def _decided_and_committed(root, reservation, signals, reader, thresholds, own=None):
    """Decide the reserved shard against ``reader`` and commit it, as the stage does: its postings
    (``own``, or built here) handed to the decision and the commit where the code measured takes
    them (code from before that builds them again in each)."""
    from speechdata.quality.near_dup_index import commit_shard_entries, index_keys
    from speechdata.quality.near_dup_matching import decide_shard

    if "own_postings" not in inspect.signature(decide_shard).parameters:
        decisions = decide_shard(reservation.position, signals, reader, thresholds)
        commit_shard_entries(root, reservation, signals, decisions)
        return decisions
    own = index_keys(signals, reservation.position) if own is None else own
    decisions = decide_shard(reservation.position, signals, reader, thresholds, own_postings=own)
    commit_shard_entries(root, reservation, signals, decisions, postings=own)
    return decisions


class IndexLockTimes:
    """Milliseconds the corpus index lock was held in the block, by what took it: ``reserve``,
    ``commit``, ``compact`` (each module's ``corpus_index_lock`` wrapped where it looks it up; the
    time counted from the lock's acquisition to its release, the wait for it left out)."""

    MODULES = {
        "reserve": "speechdata.quality.near_dup_index_order",
        "commit": "speechdata.quality.near_dup_index_commit",
        "compact": ("speechdata.quality.near_dup_index_merge", "speechdata.quality.near_dup_index_repair"),
    }
    """Where each one looks the lock up: the first of the names that the measured code has (merges
    lived in the repair module before they had a module of their own)."""

    def __init__(self):
        self.held_s = dict.fromkeys(self.MODULES, 0.0)
        self._saved = []

    def _timed(self, label: str, lock):
        import contextlib

        @contextlib.contextmanager
        def timed(*args, **kwargs):
            with lock(*args, **kwargs) as holder:
                started = time.perf_counter()
                try:
                    yield holder
                finally:
                    self.held_s[label] += time.perf_counter() - started

        return timed

    def __enter__(self):

        for label, names in self.MODULES.items():
            module = _first_importable(names if isinstance(names, tuple) else (names,))
            self._saved.append((module, module.corpus_index_lock))
            module.corpus_index_lock = self._timed(label, module.corpus_index_lock)
        return self

    def __exit__(self, *exc) -> None:
        for module, lock in self._saved:
            module.corpus_index_lock = lock

    def figures(self) -> dict[str, float]:
        return {label: round(1_000 * seconds, 2) for label, seconds in self.held_s.items()}


PROFILE_ENV = "SPEECHDATA_BENCH_PROFILE_DIR"


def indexed_shards(url: str) -> int:
    """Entries files in the index at ``url`` (the shards indexed, the measured one included)."""
    import os

    folder = os.path.join(url, "index", "near_duplicates", "entries")
    return len(os.listdir(folder)) if os.path.isdir(folder) else 0


def _segment_sizes(url: str) -> dict[str, dict]:
    """Each segment of the index at ``url``: its size and its key filter's, in MB."""
    import os

    folder = os.path.join(url, "index", "near_duplicates", "segments")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    sizes = {}
    for name in names:
        if name.endswith(".seg") and f"{name}.filter" in names:
            sizes[name] = {
                "mb": round(os.path.getsize(os.path.join(folder, name)) / 2**20, 1),
                "filter_mb": round(os.path.getsize(os.path.join(folder, f"{name}.filter")) / 2**20, 1),
            }
    return sizes


def _reader_figures(reader, sizes: dict[str, dict]) -> dict:
    """What the reader counted (where the code measured counts it) and the live segments it read,
    each with its size and its key filter's (``sizes``: taken before the shard committed)."""
    figures = {
        name: getattr(reader, name)
        for name in (
            "entries_fetched",
            "filter_bytes_read",
            "segment_bytes_read",
            "blocks_read",
            "blocks_read_by_chance",
        )
        if hasattr(reader, name)
    }
    figures["live_segments"] = {name: sizes.get(name) for name in sorted(getattr(reader, "_live", {}))}
    return figures


def _stage_flow(root, shard_id: str, signals, thresholds) -> dict:
    """One shard through the stage's own order (``run_near_duplicates`` less the audio): reserve,
    prefetch the postings of its keys, wait for the shards reserved before it, settle, decide,
    commit, compact. Returns its seconds in all and waiting."""
    from speechdata.quality.near_dup_index import (
        IndexDamaged,
        IndexReader,
        compact_index,
        index_keys,
        repair_index,
        reserve_position,
        wait_for_earlier,
    )

    started = time.perf_counter()
    with IndexLockTimes() as lock_times:
        for attempt in range(3):
            try:
                with reserve_position(root, shard_id) as reservation:
                    reader = IndexReader(root, reservation.position)
                    own = index_keys(signals, reservation.position)
                    reader.prefetch(own["key"])
                    waiting = time.perf_counter()
                    state = wait_for_earlier(root, reservation)
                    waited = time.perf_counter() - waiting
                    reader.settle(state)
                    _decided_and_committed(root, reservation, signals, reader, thresholds, own)
                break
            except IndexDamaged:
                # As the stage does: a segment merged away while this shard read the order before the
                # switch reads as missing; repair finds it whole and the shard decides again.
                if attempt == 2:
                    raise
                repair_index(root)
        compact_index(root)
    return {
        "wall_s": time.perf_counter() - started,
        "waited_s": waited,
        "attempts": attempt + 1,
        "lock_held_ms": lock_times.figures(),
    }


def _one_of_many(url: str, utterances: int, number: int, ready, results) -> None:
    """One of the simultaneous shards: ready (imports and signals done), released with the others."""
    from speechdata.quality.near_dup_matching import NearDuplicateThresholds

    root, signals = _new_shard(url, utterances, f"batch{number:02d}", seed=100 + number)
    _warm_up(f"{url}-{number}")
    if ready is not None:
        ready.wait(timeout=1_800)
    figures = _stage_flow(root, f"batch{number:02d}", signals, NearDuplicateThresholds())
    figures["finished_at"] = time.time()
    results[number] = figures


def measure_simultaneous(url: str, utterances: int, shards: int = 16) -> dict:
    """``shards`` new shards reaching near duplicates at once (each its own process, released
    together once all are ready): when the last finishes, against one alone (measured first, on
    the same index). On a machine with fewer cores than shards the decisions themselves queue for
    the CPU: ``cpu_bound_floor_s`` = one alone x shards / cores is what no index design beats there."""
    import os

    single = in_fresh_process(_one_of_many, url, utterances, 99, None)[99]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        results = manager.dict()
        ready = context.Barrier(shards + 1)
        workers = [
            context.Process(target=_one_of_many, args=(url, utterances, number, ready, results))
            for number in range(shards)
        ]
        for worker in workers:
            worker.start()
        ready.wait(timeout=1_800)  # a worker that failed before it was ready breaks the barrier
        start_at = time.time()
        for worker in workers:
            worker.join()
        if any(worker.exitcode != 0 for worker in workers):
            raise RuntimeError("a simultaneous shard failed")
        finished = {number: dict(figures) for number, figures in results.items()}
    last = max(figures["finished_at"] for figures in finished.values()) - start_at
    cores = len(os.sched_getaffinity(0))
    return {
        "shards": shards,
        "one_alone_s": round(single["wall_s"], 3),
        "last_of_many_s": round(last, 3),
        "last_over_one": ratio(last, single["wall_s"]),
        "longest_wait_s": round(max(figures["waited_s"] for figures in finished.values()), 3),
        "decided_again": sum(figures["attempts"] - 1 for figures in finished.values()),
        "cores": cores,
        "cpu_bound_floor_s": round(single["wall_s"] * shards / min(cores, shards), 3),
        # The index lock per shard (reservation, commit, compaction's switch): what serializes them.
        "lock_held_ms": {
            "one_alone": single["lock_held_ms"],
            "mean_of_many": {
                label: round(statistics.fmean(f["lock_held_ms"][label] for f in finished.values()), 2)
                for label in IndexLockTimes.MODULES
            },
            "max_of_many": {
                label: round(max(f["lock_held_ms"][label] for f in finished.values()), 2)
                for label in IndexLockTimes.MODULES
            },
        },
    }


def _first_importable(names: tuple[str, ...]):
    import importlib.util

    for name in names[:-1]:
        if importlib.util.find_spec(name) is not None:
            return importlib.import_module(name)
    return importlib.import_module(names[-1])


def _warm_up(url: str) -> None:
    """Load what either path imports on first use (the lock, the parquet writer, which imports
    pandas) outside the timing: a step pays it once per process, not per shard."""
    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_dup_index import read_order, reserve_position

    scratch = DataRoot(f"{url}-warm-up")
    with reserve_position(scratch, "warm-up"):
        read_order(DataRoot(url))
    scratch.fs.rm(scratch.root, recursive=True)


def in_fresh_process(target, *args):
    """``target(*args, results)`` in a fresh (spawned) interpreter; the dict it filled. The dict comes
    back through a pipe once the target returns: a manager process per call would be one more
    interpreter start, paid on every measurement."""
    context = multiprocessing.get_context("spawn")
    receiving, sending = context.Pipe(duplex=False)
    worker = context.Process(target=_send_results, args=(target, args, sending))
    worker.start()
    sending.close()
    try:
        results = receiving.recv()  # before the join: a large dict would fill the pipe and block the worker
    except EOFError:
        results = None
    finally:
        receiving.close()
    worker.join()
    if worker.exitcode != 0 or results is None:
        raise RuntimeError(f"{target.__name__}{args} exited {worker.exitcode}")
    return results


def in_this_process(target, *args) -> dict:
    """``target(*args, results)`` here, as :func:`in_fresh_process` runs it in a fresh interpreter: a
    smoke run's shortcut (its figures then include what earlier measurements imported and kept)."""
    results: dict = {}
    target(*args, results)
    return results


def _send_results(target, args: tuple, sending) -> None:
    results: dict = {}
    target(*args, results)
    sending.send(results)
    sending.close()


def timed_build(url, shards, utterances, results):
    """:func:`build_index` with its wall time in ``results['build_s']`` (a measurement child's target)."""
    started = time.perf_counter()
    build_index(url, shards, utterances)
    results["build_s"] = round(time.perf_counter() - started, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="indexes of 2 and 8 shards of 40 utterances, all in this process"
    )
    parser.add_argument("--shards", type=int, nargs=2, default=(10, 200), help="the two index sizes")
    parser.add_argument("--utterances", type=int, default=300, help="per shard, and in the new shard")
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.utterances = (2, 8), 40
    run = in_this_process if args.quick else in_fresh_process
    per_size = {}
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-near-dup-index-") as folder:
        for shards in args.shards:
            url = f"{folder}/n{shards}"
            built = run(timed_build, url, shards, args.utterances)
            progress(f"{shards} shards indexed in {built['build_s']} s")
            figures = {"indexed_hours": round(shards * args.utterances * 4.8 / 3600, 1), **built}
            for path in ("baseline_whole_index", "postings_index"):
                figures.update(run(measure, url, args.utterances, path))
                progress(f"{shards} shards, {path}: {figures[path]}")
            per_size[shards] = figures
    small, large = args.shards
    growth = {
        path: {
            "wall": ratio(per_size[large][path]["wall_s"], per_size[small][path]["wall_s"]),
            "added_rss": ratio(per_size[large][path]["added_rss_mb"], max(per_size[small][path]["added_rss_mb"], 1.0)),
        }
        for path in ("baseline_whole_index", "postings_index")
    }
    emit(
        "near_duplicates_index",
        {"quick": args.quick, "shards": list(args.shards), "utterances": args.utterances},
        {
            "per_size": per_size,
            "growth": growth,
            "new_over_baseline_wall_at_largest": ratio(
                per_size[large]["postings_index"]["wall_s"], per_size[large]["baseline_whole_index"]["wall_s"]
            ),
        },
    )


if __name__ == "__main__":
    main()
