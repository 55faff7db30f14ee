"""The original publishing script's cycle: its CSV manifest in pandas against the project's DuckDB state.

Why: the original publishing script tracks every segment of a country in ``[country]_manifest.csv``
and, on every upload batch, reads the whole CSV with pandas, selects, changes a status column and
writes the whole CSV back. The project keeps the same state in DuckDB (:mod:`speechdata.hf.state`:
``segments`` with ``split`` and ``status``) and the segment facts (language, duration, CER) in
parquet, and changes only the rows a batch touched, in a transaction.

Input: ``--segments`` segments of one country (two languages, 10 segments per recording, 80 %
train, 30 % of them already uploaded), built before timing as (a) the baseline's CSV with its columns
(its "Central Manifest CSV Schema", transcripts included) and (b) a state database made with
the project's schema plus a parquet of the facts.

Timed (wall-clock), ``--repeats`` cycles of each, alternating, each marking the next batch (as
successive uploads do); the medians are compared. The project's cycles run in a process of their
own (:func:`project_worker`, imports done before timing), as the two workflows do in use: run in the
process the baseline's pandas cycle had just used, a DuckDB cycle cost markedly more (memory the
baseline freed).

* baseline: ``pd.read_csv``; hours per language (``groupby``); the pending train segments with
  ``cer <= --max-cer`` in file order; the first ``--batch`` of them marked ``uploaded``; ``to_csv``;
* project: :func:`speechdata.hf.state.state_connection` (open, transaction); hours per language
  from the parquet; the same selection (:func:`choose_batch`: key windows of ``segments``, each
  one query with the CER cap looked up in the parquet's same key range); ``UPDATE ... WHERE rowid IN`` the chosen rows via
  :func:`~speechdata.hf.state.registered_rows`; commit.

Before each timed cycle, ``os.sync()`` (untimed) writes back every dirty page: otherwise the
DuckDB commit's log sync waits for the CSV the baseline cycle has just written. Last, the cycle as it
was before the key-window batch selection (:func:`previous_duckdb_cycle`: a top-N over every pending key,
``UPDATE ... FROM`` the chosen keys) runs on a fresh copy of the state, for a before/after in one run.

Both must choose the same keys and report the same hours (checked). Reported: seconds of each,
``ratio_baseline_over_duckdb`` (target >= 100).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call

TARGET_RATIO = 100.0
FACTS_ROW_GROUP_ROWS = 65_536
COUNTRY = "india"


def synthetic(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    index = np.arange(n)
    video = index // 10
    start_ms = (index % 10) * 20_000 + rng.integers(0, 1000, n)
    duration = np.round(rng.uniform(3.0, 20.0, n), 3)
    end_ms = start_ms + (duration * 1000).astype(np.int64)
    video_ids = np.char.add("v", np.char.zfill(video.astype(str), 8))
    keys = np.char.add(np.char.add(np.char.add(f"{COUNTRY}_", video_ids), "_"), np.char.zfill(start_ms.astype(str), 7))
    split = np.where(rng.random(video.max() + 1) < 0.8, "train", np.where(rng.random(video.max() + 1) < 0.5, "test", "validation"))[video]  # fmt: skip
    status = np.where(rng.random(n) < 0.3, "uploaded", "pending")
    return {
        "key": keys,
        "country": np.full(n, COUNTRY),
        "language": np.where(video % 3 == 0, "en", "hi"),
        "video_id": video_ids,
        "transcript_id": np.char.add("t", video.astype(str)),
        "source_audio_path": np.char.add(np.char.add("countries/india/audio/", video_ids), ".wav"),
        "start_seconds": start_ms / 1000,
        "end_seconds": end_ms / 1000,
        "duration_seconds": duration,
        "asr_transcript": np.char.add("यह एक परीक्षण वाक्य है number ", index.astype(str)),
        "human_transcript": np.char.add("यह एक परीक्षण वाक्य है नंबर ", index.astype(str)),
        "cer": np.round(rng.beta(1.5, 12.0, n), 4),
        "wer": np.round(rng.beta(2.0, 8.0, n), 4),
        "original_transcript_start_idx": index * 3,
        "original_transcript_end_idx": index * 3 + 2,
        "status": status,
        "error_message": np.full(n, ""),
        "batch_id": np.zeros(n, np.int64),
        "split": split,
    }


def baseline_cycle(csv_path: str, max_cer: float, batch: int) -> tuple[dict, list[str]]:
    import pandas as pd

    df = pd.read_csv(csv_path, keep_default_na=False)
    hours = (df.groupby("language")["duration_seconds"].sum() / 3600).to_dict()
    chosen = df[
        (df["country"] == COUNTRY) & (df["status"] == "pending") & (df["split"] == "train") & (df["cer"] <= max_cer)
    ].head(batch)
    df.loc[chosen.index, "status"] = "uploaded"
    df.to_csv(csv_path, index=False)
    return hours, chosen["key"].tolist()


def duckdb_cycle(root, state: str, facts: str, max_cer: float, batch: int) -> tuple[dict, list[str]]:
    from speechdata.hf.state import registered_rows, state_connection

    with state_connection(root, state) as connection:
        hours = dict(
            connection.execute(
                "SELECT language, sum(duration_seconds) / 3600 FROM read_parquet(?) GROUP BY language", [facts]
            ).fetchall()
        )
        chosen = choose_batch(connection, facts, max_cer, batch)
        # Row ids are stable inside the transaction: the UPDATE finds its rows without a join on
        # the key column (which would decompress every key of the table).
        with registered_rows(connection, "chosen", {"row": chosen["row"]}):
            connection.execute(
                "UPDATE segments SET status = 'uploaded', updated_at = current_timestamp "
                "WHERE rowid IN (SELECT row FROM chosen)"
            )
    return hours, chosen["key"].to_pylist()


def choose_batch(connection, facts: str, max_cer: float, batch: int) -> pa.Table:
    """The first ``batch`` pending train segments (key order) with ``cer <= max_cer``: ``key``, ``row`` (rowid).

    A top-N over the whole table decompresses and compares every pending key; instead the keys are
    taken window by window, ``(after, upper]``, each small enough for DuckDB to skip most of the
    table and of the facts' row groups. ``upper`` is the key at a growing row id: a guess at the key
    order from the storage order (it is exact when segments were registered in key order, as here;
    any other order only makes windows smaller or larger, never changes the result, since each
    window is sorted and the next starts where it ended). One query per window: the window's
    pending train keys whose facts pass the CER cap, first ``need`` in key order.
    """
    rows_total = connection.execute("SELECT count(*) FROM segments").fetchall()[0][0]

    def key_at(row: int) -> str | None:
        return connection.execute("SELECT key FROM segments WHERE rowid = ?", [row]).fetchall()[0][0]

    chosen: list[pa.Table] = []
    need, after = batch, ""
    window_rows = probe = 4 * batch
    upper = key_at(probe) if probe < rows_total else None
    while need > 0:
        in_window = "key > $after" + (" AND key <= $upper" if upper is not None else "")
        passing = connection.sql(
            f"SELECT key, rowid AS row FROM segments WHERE status = 'pending' AND split = 'train' AND {in_window} "
            f"AND key IN (SELECT key FROM read_parquet($facts) WHERE cer <= $max_cer AND {in_window}) "
            "ORDER BY key LIMIT $need",
            params={"after": after, "facts": facts, "max_cer": max_cer, "need": need}
            | ({"upper": upper} if upper is not None else {}),
        ).to_arrow_table()
        chosen.append(passing)
        need -= passing.num_rows
        if need == 0 or upper is None:
            break  # full, or every key after ``after`` was looked at
        after = upper  # the window held fewer than needed: the next one, twice as many rows
        # A key at or before ``after`` (storage order is not key order there) says nothing.
        while upper is not None and upper <= after:
            window_rows *= 2
            probe += window_rows
            upper = key_at(probe) if probe < rows_total else None
    empty = pa.table({"key": pa.array([], pa.string()), "row": pa.array([], pa.int64())})
    return pa.concat_tables(chosen) if chosen else empty


def previous_duckdb_cycle(root, state: str, facts: str, max_cer: float, batch: int) -> tuple[dict, list[str]]:
    from speechdata.hf.state import registered_rows, state_connection

    with state_connection(root, state) as connection:
        hours = dict(
            connection.execute(
                "SELECT language, sum(duration_seconds) / 3600 FROM read_parquet(?) GROUP BY language", [facts]
            ).fetchall()
        )
        chosen = previous_choose_batch(connection, facts, max_cer, batch)
        with registered_rows(connection, "chosen", {"key": chosen["key"]}):
            connection.execute(
                "UPDATE segments SET status = 'uploaded', updated_at = current_timestamp "
                "FROM chosen WHERE segments.key = chosen.key"
            )
    return hours, chosen["key"].to_pylist()


def previous_choose_batch(connection, facts: str, max_cer: float, batch: int) -> pa.Table:
    """Before the key-window batch selection (kept to time it in the same run): the first ``batch``
    pending train keys (key order) with ``cer <= max_cer``.

    Joining all pending keys to the facts costs a hash table of every pending key; instead take the
    next candidates in key order (a top-N, no join), look up their CER with a small semi-join, and
    go on past the last candidate until the batch is full or none are left.
    """
    chosen: list[pa.Table] = []
    need, after = batch, ""
    while need > 0:
        candidates = connection.sql(
            "SELECT key FROM segments WHERE status = 'pending' AND split = 'train' AND key > $after "
            "ORDER BY key LIMIT $limit",
            params={"after": after, "limit": 2 * need + 100},
        ).to_arrow_table()
        if candidates.num_rows == 0:
            break
        connection.register("candidates", candidates)
        passing = connection.sql(
            "SELECT f.key FROM read_parquet($facts) f SEMI JOIN candidates c ON c.key = f.key "
            "WHERE f.cer <= $max_cer AND f.key BETWEEN $low AND $high ORDER BY f.key LIMIT $need",
            # The key range lets the parquet reader skip row groups by their min/max statistics.
            params={
                "facts": facts,
                "max_cer": max_cer,
                "need": need,
                "low": candidates["key"][0].as_py(),
                "high": candidates["key"][-1].as_py(),
            },
        ).to_arrow_table()
        connection.unregister("candidates")
        chosen.append(passing)
        need -= passing.num_rows
        after = candidates["key"][-1].as_py()
    return pa.concat_tables(chosen) if chosen else pa.table({"key": pa.array([], pa.string())})


def project_worker(pipe, root_path: str, state: str, facts: str, max_cer: float, batch: int) -> None:
    """Runs the project's cycles in a process of its own, on request: ``"new"`` or ``"previous"``.

    The baseline's cycle allocates and frees gigabytes in pandas; a DuckDB cycle run next in the same
    process paid for it (measured step by step: mostly connect and close). Each workflow runs in its
    own process in use, so here too.
    """
    import duckdb
    import pandas  # noqa: F401  DuckDB's Python binding imports it on first use, untimed as in the baseline's process

    import speechdata.hf.state  # noqa: F401
    from speechdata.io.storage import DataRoot

    duckdb.connect(":memory:").execute("SELECT 1").fetchall()  # the process's first DuckDB database, untimed
    root = DataRoot(root_path)
    cycles = {"new": duckdb_cycle, "previous": previous_duckdb_cycle}
    pipe.send("ready")
    while (request := pipe.recv()) is not None:
        started = time.perf_counter()
        hours, keys = cycles[request](root, state, facts, max_cer, batch)
        pipe.send((time.perf_counter() - started, hours, keys))


def build_state(root, state: str, columns: dict[str, np.ndarray]) -> None:
    from speechdata.hf.state import registered_rows, state_connection

    recordings = {
        "recording_id": np.unique(columns["video_id"]),
    }
    first = np.searchsorted(columns["video_id"], recordings["recording_id"])
    with state_connection(root, state) as connection:
        with registered_rows(
            connection,
            "new_recordings",
            {
                "recording_id": pa.array(recordings["recording_id"]),
                "audio_path": pa.array(columns["source_audio_path"][first]),
                "split": pa.array(columns["split"][first]),
            },
        ):
            connection.execute(
                "INSERT INTO recordings (recording_id, video_id, shard_id, audio_path, duration_hours, split) "
                "SELECT recording_id, recording_id, 'shard', audio_path, 0.0, split FROM new_recordings"
            )
        with registered_rows(
            connection,
            "new_segments",
            {name: pa.array(columns[name]) for name in ("key", "video_id", "split", "status")},
        ):
            connection.execute(
                "INSERT INTO segments (key, recording_id, shard_id, split, status) "
                "SELECT key, video_id, 'shard', split, status FROM new_segments"
            )


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 000 segments, for smoke runs")
    parser.add_argument("--segments", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000, help="segments marked uploaded")
    parser.add_argument("--max-cer", type=float, default=0.15)
    parser.add_argument("--repeats", type=int, default=3, help="cycles of each, alternating; medians compared")
    args = parser.parse_args(argv)
    if args.quick:
        args.segments, args.batch, args.repeats = 50_000, 1_000, 1
    return args


def write_inputs(tmp: str, segments: int) -> tuple[str, str, str]:
    """The baseline's CSV, the state database (and an untouched copy) and the segment facts:
    (CSV path, state, facts path)."""
    import pandas as pd

    from speechdata.io.layout import hf_state_database
    from speechdata.io.storage import DataRoot

    columns = synthetic(segments)
    csv_path = os.path.join(tmp, f"{COUNTRY}_manifest.csv")
    pd.DataFrame(columns).to_csv(csv_path, index=False)
    root = DataRoot(tmp)
    state = hf_state_database("bench", COUNTRY)
    build_state(root, state, columns)
    shutil.copy(root.path(state), root.path(state + ".before"))
    facts = os.path.join(tmp, "segments.parquet")
    pq.write_table(
        pa.table({name: columns[name] for name in ("key", "language", "duration_seconds", "cer")}),
        facts,
        row_group_size=FACTS_ROW_GROUP_ROWS,
    )
    progress(f"{segments} segments; CSV {os.path.getsize(csv_path) / 1e6:.0f} MB")
    return csv_path, state, facts


def alternate_cycles(pipe, csv_path: str, args: argparse.Namespace) -> dict:
    """Baseline and DuckDB cycles in turn, ``--repeats`` times, each batch the next pending segments,
    as repeated uploads go. Untimed before each: write back every dirty page, so neither cycle pays
    for the other's writes (DuckDB's commit syncs its log, which waited for the CSV the baseline had
    just written)."""
    baseline_runs, duck_runs, duck_batches = [], [], []
    same_keys = same_hours = True
    for _ in range(args.repeats):
        os.sync()
        seconds, (baseline_hours, baseline_keys) = timed_call(
            lambda: baseline_cycle(csv_path, args.max_cer, args.batch)
        )
        baseline_runs.append(seconds)
        os.sync()
        pipe.send("new")
        seconds, duck_hours, duck_keys = pipe.recv()
        duck_runs.append(seconds)
        duck_batches.append((duck_hours, duck_keys))
        progress(f"baseline {baseline_runs[-1]:.2f} s, duckdb {duck_runs[-1]:.3f} s")
        same_keys &= baseline_keys == duck_keys
        same_hours &= set(baseline_hours) == set(duck_hours) and all(
            abs(baseline_hours[k] - duck_hours[k]) < 1e-6 for k in baseline_hours
        )
    assert same_keys and same_hours, "the two cycles disagree"
    return {"baseline": baseline_runs, "duckdb": duck_runs, "batches": duck_batches, "same": same_keys and same_hours}


def previous_cycles(pipe, repeats: int) -> tuple[list[float], list]:
    """The previous cycle, as many batches (the caller restores the state first)."""
    runs, batches = [], []
    for _ in range(repeats):
        os.sync()
        pipe.send("previous")
        seconds, hours, keys = pipe.recv()
        runs.append(seconds)
        batches.append((hours, keys))
    return runs, batches


def measure_cycles(tmp: str, args: argparse.Namespace) -> tuple[dict, list[float]]:
    """Both cycles against each other, then the previous cycle on a fresh copy of the state (the
    copy untimed); the project's cycles run in a worker process that imported them first."""
    from speechdata.io.storage import DataRoot

    csv_path, state, facts = write_inputs(tmp, args.segments)
    context = multiprocessing.get_context("spawn")
    pipe, child_pipe = context.Pipe()
    worker = context.Process(
        target=project_worker, args=(child_pipe, tmp, state, facts, args.max_cer, args.batch), daemon=True
    )
    worker.start()
    try:
        assert pipe.recv() == "ready"
        cycles = alternate_cycles(pipe, csv_path, args)
        root = DataRoot(tmp)
        shutil.copy(root.path(state + ".before"), root.path(state))
        previous_runs, previous_batches = previous_cycles(pipe, args.repeats)
    finally:
        pipe.send(None)
        worker.join(timeout=60)
    for (previous_hours, previous_keys), (duck_hours, duck_keys) in zip(
        previous_batches, cycles["batches"], strict=True
    ):
        # DuckDB's parallel sum may add in another order: equal within 1e-6 hours.
        assert previous_keys == duck_keys
        assert all(abs(previous_hours[k] - duck_hours[k]) < 1e-6 for k in duck_hours)
    return cycles, previous_runs


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp:
        import pandas as pd  # noqa: F401  imported before timing

        import speechdata.hf.state  # noqa: F401  imported before timing, as pandas is

        cycles, previous_runs = measure_cycles(tmp, args)
    baseline_s, duck_s, previous_s = (
        statistics.median(runs) for runs in (cycles["baseline"], cycles["duckdb"], previous_runs)
    )
    speedup = ratio(baseline_s, duck_s)
    emit(
        "publish_state",
        {
            "quick": args.quick,
            "segments": args.segments,
            "batch": args.batch,
            "max_cer": args.max_cer,
            "repeats": args.repeats,
        },
        {
            "baseline_csv_pandas_seconds": round(baseline_s, 3),
            "duckdb_state_seconds": round(duck_s, 4),
            "baseline_seconds_each": [round(x, 3) for x in cycles["baseline"]],
            "duckdb_seconds_each": [round(x, 4) for x in cycles["duckdb"]],
            "previous_duckdb_cycle_seconds": round(previous_s, 4),
            "ratio_baseline_over_duckdb": speedup,
            "meets_target": bool(speedup and speedup >= TARGET_RATIO),
            "marked_uploaded": sum(len(keys) for _, keys in cycles["batches"]),
            "same_selection_and_hours": cycles["same"],
        },
    )


if __name__ == "__main__":
    main()
