"""The near-duplicate index's merges split between a shard's own run (small ones, up to the inline
level) and the compaction job (the rest): the same decisions, byte for byte, whatever the schedule;
a shard committed while the job merges keeps its decisions and its postings; a job killed midway and
run again leaves the clean index; the sensor launches one job per due merge and none while one runs.

Shards are real ``run_near_duplicates`` runs on planted speech whose signals are computed once for
the module (the audio decode is not what is tested), with ``FANOUT`` 2 so that a few shards reach
several levels."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import time

import dagster as dg
import pytest
from dagster._core.storage.defs_state.base import DefsStateStorage

from assets.near_duplicates import near_duplicates_compaction, near_duplicates_compaction_job
from resources.storage import DataRootResource
from sensors.near_duplicates import MERGE_TAG, near_duplicates_compaction_sensor
from speechdata import cli
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_merge, near_duplicates
from speechdata.quality.near_dup_compaction import (
    INLINE_MERGE_LEVEL_ENV,
    compact_pending,
    merges_due,
    merges_due_above,
)
from speechdata.quality.near_dup_index import corpus_index_lock, read_state, repair_index, write_index
from speechdata.quality.near_dup_matching import Decision
from speechdata.quality.near_dup_order_log import ORDER_LOG
from speechdata.quality.near_dup_planted import SAMPLE_RATE, planted_set
from speechdata.quality.near_duplicates import run_near_duplicates, utterance_signals
from speechdata.quality.paths import near_duplicate_flags

SHARDS = [f"s{number}" for number in range(8)]
EVERYTHING_INLINE = "9"


@pytest.fixture(scope="module")
def planted() -> dict[str, list]:
    """Eight shards of two planted utterances (originals first, then their copies and look-alikes),
    plus ``during`` (a copy of an original and a new utterance) and ``after`` (a copy of ``during``'s
    new utterance): their signals, by shard."""
    utterances = planted_set(6, seed=5)
    by_shard = {shard: utterances[2 * number : 2 * number + 2] for number, shard in enumerate(SHARDS)}
    by_shard["during"] = utterances[16:18]  # copy-0005 (of orig-0005, in s2) and negative-0005
    by_shard["after"] = [utterances[17]]
    return {
        shard: sorted(
            (utterance_signals(shard, f"{shard}-{u.utt_id}", u.samples, SAMPLE_RATE, u.text) for u in members),
            key=lambda s: s.utt_id,
        )
        for shard, members in by_shard.items()
    }


@pytest.fixture(scope="module")
def instance():
    """One Dagster instance for the sensor's and the job's tests (each asks only about its own merges'
    runs, named by their inputs, or about runs in progress, which none leaves)."""
    current_before = DefsStateStorage.get()
    with dg.instance_for_test() as shared:
        yield shared
    # A Dagster instance a test left open (an op context built without one) is closed by the collector,
    # and its close makes current again the instance that was current when it opened: this deleted one,
    # which the next module resolving definitions in this process would then read.
    gc.collect()
    assert DefsStateStorage.get() is current_before, "a test of this module left a Dagster instance open"


def _fanout_two(monkeypatch, planted) -> None:
    monkeypatch.setattr(near_dup_index_merge, "FANOUT", 2)
    monkeypatch.setattr(near_duplicates, "shard_signals", lambda data_root, shard_id: (planted[shard_id], [], 0.0))


@pytest.fixture(scope="module")
def l1_merge_due(tmp_path_factory, planted) -> DataRoot:
    """Four shards run at inline level 1, an L1 merge due: built once, copied by the tests that start there."""
    root = DataRoot(str(tmp_path_factory.mktemp("l1-merge-due") / "root"))
    with pytest.MonkeyPatch.context() as patch:
        _fanout_two(patch, planted)
        patch.setenv(INLINE_MERGE_LEVEL_ENV, "1")
        for shard in SHARDS[:4]:
            run_near_duplicates(root, shard)
    return root


@pytest.fixture
def small_fanout(monkeypatch, planted, l1_merge_due):
    _fanout_two(monkeypatch, planted)
    _L1_MERGE_DUE[:] = [l1_merge_due]
    return monkeypatch


_L1_MERGE_DUE: list[DataRoot] = []
"""The module's :func:`l1_merge_due` index, for :func:`four_shards_with_an_l1_merge_due`."""


def segment_files(root: DataRoot) -> list[str]:
    return sorted(path.rsplit("/", 1)[1] for path in root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*"))


def levels(root: DataRoot) -> list[str]:
    return sorted(name.split("-")[0] for name in segment_files(root) if name.endswith(".seg"))


def decision_files(root: DataRoot, shards) -> dict[str, bytes]:
    return {
        f"{shard}/{which}": root.fs.cat_file(root.path(path))
        for shard in shards
        for which, path in (("decisions", layout.near_duplicates(shard)), ("flags", near_duplicate_flags(shard)))
    }


def assert_clean(root: DataRoot) -> None:
    """Every segment on disk (with its filter) is one a committed row maps to, and nothing needs repair."""
    mapped = {shard.segment for shard in read_state(root)}
    assert segment_files(root) == sorted([*mapped, *(f"{name}.filter" for name in mapped)])
    assert repair_index(root) == []


def test_decisions_are_the_same_bytes_with_merges_inline_or_in_the_compaction_job(tmp_path, small_fanout, capsys):
    inline = DataRoot(str(tmp_path / "inline"))
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, EVERYTHING_INLINE)
    for shard in SHARDS:
        run_near_duplicates(inline, shard)
    compact_pending(inline)

    bounded = DataRoot(str(tmp_path / "bounded"))
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, "1")
    for number, shard in enumerate(SHARDS):
        before = set(segment_files(bounded))
        run_near_duplicates(bounded, shard)
        written = {name.split("-")[0] for name in set(segment_files(bounded)) - before}
        assert written <= {"L0", "L1"}  # a shard's run creates nothing above the inline level
        if number == 4:
            assert [due.level for due in merges_due_above(bounded)] == [1]
            assert compact_pending(bounded, max_merges=1).merges[0].level == 1
    assert [(due.level, due.waiting) for due in merges_due_above(bounded)] == [(1, 2)]
    lines = []
    summary = compact_pending(bounded, max_merges=1, on_progress=lines.append)
    assert lines[0].startswith("merging 2 L1 segments (") and lines[0].endswith("MB) into one of L2")
    assert lines[1].startswith("merged into L2-") and [m.level for m in summary.merges] == [1]
    assert cli.run(["near-duplicates", "compact", "--data-root", bounded.root]) == 0  # the rest
    assert "1 L2->L3" in (out := capsys.readouterr().out) and "nothing more is due" in out
    assert not merges_due(bounded) and levels(bounded) == ["L3"]

    assert decision_files(bounded, SHARDS) == decision_files(inline, SHARDS)
    assert b"orig-0000" in decision_files(inline, ["s3"])["s3/decisions"]  # copies were found
    assert [(s.position, s.shard_id, s.entries_version, s.segment) for s in read_state(bounded)] == [
        (s.position, s.shard_id, s.entries_version, s.segment) for s in read_state(inline)
    ]


def test_a_shard_committed_during_a_large_merge_keeps_its_decisions_and_its_postings(tmp_path, small_fanout):
    root = DataRoot(str(tmp_path / "root"))
    four_shards_with_an_l1_merge_due(root, small_fanout)
    merge_segments = near_dup_index_merge.merge_segments
    committed_during = []

    def a_shard_commits_meanwhile(*args):
        if not committed_during:  # the job's merge has read its inputs' headers, not yet switched
            committed_during.append(run_near_duplicates(root, "during"))
        return merge_segments(*args)

    small_fanout.setattr(near_dup_index_merge, "merge_segments", a_shard_commits_meanwhile)
    summary = compact_pending(root)
    [during] = committed_during
    assert [merge.level for merge in summary.merges] == [1]
    assert {d.utt_id: d.representative_shard for d in during.duplicates} == {"during-copy-0005": "s2"}
    decided = decision_files(root, ["during"])
    row = next(s for s in read_state(root) if s.shard_id == "during")
    assert row.segment.startswith("L0-")  # its own segment, untouched by the switch
    run_near_duplicates(root, "during")
    assert decision_files(root, ["during"]) == decided
    found = run_near_duplicates(root, "after")  # during's postings are in the index
    assert {d.utt_id: (d.representative_shard, d.kind) for d in found.duplicates} == {
        "after-negative-0005": ("during", "exact_audio")
    }
    assert_clean(root)


class Killed(Exception):
    """The job stopped where a kill would stop it."""


@pytest.mark.parametrize("where", ["_append", "_remove_unreferenced_segments"])
def test_a_compaction_killed_midway_and_run_again_leaves_the_clean_index(tmp_path, small_fanout, where):
    """Killed after writing its merged segment and before switching it in (``_append``: the order's
    record), or after the switch and before removing its inputs."""
    root = DataRoot(str(tmp_path / "root"))
    four_shards_with_an_l1_merge_due(root, small_fanout)
    expected = decision_files(root, SHARDS[:4])

    def killed(*args, **kwargs):
        raise Killed(where)

    with small_fanout.context() as kill, pytest.raises(Killed):
        kill.setattr(near_dup_index_merge, where, killed)
        compact_pending(root)
    small_fanout.setattr(near_dup_index_merge, "ORPHAN_GRACE_S", 0.0)
    assert not compact_pending(root).still_due
    assert levels(root) == ["L2"]
    assert_clean(root)
    for shard in SHARDS[:4]:
        run_near_duplicates(root, shard)
    assert decision_files(root, SHARDS[:4]) == expected


def test_the_sensor_launches_one_compaction_per_due_merge_and_none_while_one_runs(tmp_path, small_fanout, instance):
    root = DataRoot(str(tmp_path / "root"))
    resources = {"data_root": DataRootResource(url=root.url)}
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, "1")
    for shard in SHARDS[:2]:
        run_near_duplicates(root, shard)
    tick = dg.build_sensor_context(instance=instance, resources=resources)
    assert "no merge above level 1" in near_duplicates_compaction_sensor(tick).skip_message
    for shard in SHARDS[2:4]:
        run_near_duplicates(root, shard)
    request = near_duplicates_compaction_sensor(dg.build_sensor_context(instance=instance, resources=resources))
    assert request.tags[MERGE_TAG] == merges_due_above(root)[0].key
    running = instance.create_run_for_job(
        near_duplicates_compaction_job, run_config={}, tags=request.tags, status=dg.DagsterRunStatus.STARTED
    )
    skipped = near_duplicates_compaction_sensor(dg.build_sensor_context(instance=instance, resources=resources))
    assert "in progress" in skipped.skip_message
    instance.report_run_canceled(running)
    result = near_duplicates_compaction_job.execute_in_process(
        instance=instance, resources=resources, tags={**request.tags, "dagster/run_key": request.run_key}
    )
    assert result.success and not merges_due(root)
    messages = [event.message for event in instance.all_logs(result.run_id)]  # what the run's page shows
    assert any(message.startswith("near-duplicates compact: merging 2 L1 segments (") for message in messages)
    assert any(message.startswith("near-duplicates compact: merged into L2-") for message in messages)
    assert any("1 L1->L2" in message and "nothing more is due" in message for message in messages)
    done = near_duplicates_compaction_sensor(dg.build_sensor_context(instance=instance, resources=resources))
    assert isinstance(done, dg.SkipReason)


# --- attacks from directions the tests above leave open: two compactions at once, a compaction
# beside a long rebuild under the lock, torn files after a switch, bad settings, damaged shard lists


def four_shards_with_an_l1_merge_due(root: DataRoot, monkeypatch) -> None:
    """``root``: s0-s3 run at inline level 1 (a copy of the module's, which ran them once), which
    stays the level for what the test runs next."""
    [built] = _L1_MERGE_DUE
    shutil.copytree(built.root, root.root, dirs_exist_ok=True)
    monkeypatch.setenv(INLINE_MERGE_LEVEL_ENV, "1")
    assert [due.level for due in merges_due_above(root)] == [1]


def test_two_compactions_of_the_same_merge_switch_it_in_once(tmp_path, small_fanout):
    """The CLI and the job (or two job runs) pick the same due merge: the second, finishing after the
    first switched and removed the inputs, switches nothing, records nothing and counts no merge."""
    root = DataRoot(str(tmp_path / "root"))
    four_shards_with_an_l1_merge_due(root, small_fanout)
    merge_segments = near_dup_index_merge.merge_segments
    other = []

    def the_other_compaction_finishes_first(*args):
        if not other:
            small_fanout.setattr(near_dup_index_merge, "merge_segments", merge_segments)
            other.append(compact_pending(root))
        return merge_segments(*args)

    small_fanout.setattr(near_dup_index_merge, "merge_segments", the_other_compaction_finishes_first)
    log_before = sorted(root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/**"))
    late = compact_pending(root)
    [first] = other
    assert [merge.level for merge in first.merges] == [1] and late.merges == []
    assert levels(root) == ["L2"] and not merges_due(root)
    written = sorted(set(root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/**")) - set(log_before))
    assert len([path for path in written if "/segments/" not in path]) == len(
        _one_compaction_writes(tmp_path, small_fanout)
    )
    assert_clean(root)


def _one_compaction_writes(tmp_path, monkeypatch) -> list[str]:
    """What one compaction alone adds to the index outside its segments (the order's records)."""
    root = DataRoot(str(tmp_path / "alone"))
    four_shards_with_an_l1_merge_due(root, monkeypatch)
    before = set(root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/**"))
    compact_pending(root)
    return [path for path in set(root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/**")) - before if "/segments/" not in path]


def an_hour_old(root: DataRoot, segment: str) -> None:
    """Backdate a segment and its filter, as though written more than ``ORPHAN_GRACE_S`` ago."""
    past = time.time() - 2 * near_dup_index_merge.ORPHAN_GRACE_S
    for name in (segment, f"{segment}.filter"):
        with contextlib.suppress(FileNotFoundError):
            os.utime(root.path(f"{layout.NEAR_DUPLICATES_INDEX}/segments/{name}"), (past, past))


def test_a_compaction_beside_a_long_rebuild_under_the_lock_removes_none_of_its_segments(
    tmp_path, small_fanout, planted
):
    """The batch pass (``write_index``) and a shard's repair of an index of an earlier format write
    level-0 segments under the index lock for as long as the corpus takes, naming them in the order
    only at the end. A compaction that runs meanwhile, hours in, reads the order from before: it must
    not take those segments for orphans."""
    root = DataRoot(str(tmp_path / "root"))
    write_level0 = near_dup_index_merge._write_level0
    written, swept = [], []

    def a_compaction_hours_in(data_root, shard_id, *args):
        written.append(write_level0(data_root, shard_id, *args))
        if shard_id == SHARDS[1]:
            for name in written:
                an_hour_old(root, name)
            swept.append(compact_pending(root, timeout_s=0.0))
        return written[-1]

    small_fanout.setattr(near_dup_index_merge, "_write_level0", a_compaction_hours_in)
    themselves = [
        (shard, planted[shard], [Decision(s.utt_id, shard, s.utt_id, None, 1.0) for s in planted[shard]])
        for shard in SHARDS[:4]
    ]
    write_index(root, themselves)
    assert swept and levels(root) == ["L2"]
    assert_clean(root)


@contextlib.contextmanager
def _pausing_in_merged_writes(open_atomic, data_root, relative, meanwhile):
    """``open_atomic``; for a merged (L2) segment or filter, ``meanwhile(relative)`` once its first
    piece is in its temporary file."""

    class Handle:
        def __init__(self, handle):
            self.handle, self.called = handle, False

        def write(self, piece):
            written = self.handle.write(piece)
            if not self.called:
                self.called = True
                self.handle.flush()
                meanwhile(relative)
            return written

    with open_atomic(data_root, relative) as handle:
        yield Handle(handle) if "/segments/L2-" in relative else handle


def pause_merged_writes(monkeypatch, meanwhile) -> None:
    """The compaction's own writes pause; what ``meanwhile`` writes does not."""
    open_atomic = DataRoot.open_atomic
    inside = []

    def once_at_a_time(relative):
        if not inside:
            inside.append(relative)
            try:
                meanwhile(relative)
            finally:
                inside.clear()

    monkeypatch.setattr(
        DataRoot,
        "open_atomic",
        lambda self, relative: _pausing_in_merged_writes(
            open_atomic, self, relative, once_at_a_time if not inside else lambda _: None
        ),
    )


def test_a_repair_while_a_merged_segment_is_written_leaves_the_write_alone(tmp_path, small_fanout):
    """A shard's run repairs the index (under the lock) while the job streams a merged segment into
    its temporary file (outside it): the repair checks only segments under their final names."""
    root = DataRoot(str(tmp_path / "root"))
    four_shards_with_an_l1_merge_due(root, small_fanout)
    repairs = []
    pause_merged_writes(
        small_fanout, lambda relative: repairs.append(repair_index(root)) if relative.endswith(".seg") else None
    )
    summary = compact_pending(root)
    assert repairs == [[]] and [merge.level for merge in summary.merges] == [1]
    assert levels(root) == ["L2"]
    assert_clean(root)


def test_a_merge_written_for_over_an_hour_is_never_switched_in_half_swept(tmp_path, small_fanout):
    """A large merge writes its segment for longer than ``ORPHAN_GRACE_S``; a shard's run sweeps
    orphans meanwhile. The segment is written before its filter (so the filter is young when the
    switch names the pair); and whatever a sweep took, the switch names only a whole pair."""
    root = DataRoot(str(tmp_path / "root"))
    four_shards_with_an_l1_merge_due(root, small_fanout)
    order = []

    def a_shards_merge_step_hours_later(relative):
        order.append(relative.rsplit(".", 1)[1])
        if len(order) == 2:  # the first file of the pair is written: age it past the grace
            an_hour_old(root, relative.rsplit("/", 1)[1].removesuffix(".filter"))
            assert near_dup_index_merge.compact_index(root, max_level=1) is None

    pause_merged_writes(small_fanout, a_shards_merge_step_hours_later)
    assert compact_pending(root).merges == []  # its first file was swept: nothing switched in
    assert order == ["seg", "filter"]
    for segment in {shard.segment for shard in read_state(root)}:
        assert root.exists(f"{layout.NEAR_DUPLICATES_INDEX}/segments/{segment}.filter"), segment
    assert [merge.level for merge in compact_pending(root).merges] == [1]
    assert levels(root) == ["L2"]
    assert_clean(root)


@pytest.mark.parametrize("value", ["-1", "1.5", "two", "²", "0x2"])
def test_an_inline_level_that_is_not_a_whole_number_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(INLINE_MERGE_LEVEL_ENV, value)
    with pytest.raises(ValueError, match=INLINE_MERGE_LEVEL_ENV):
        merges_due_above(DataRoot("/nonexistent-root-never-read"))


def test_the_sensor_skips_an_index_it_cannot_read_saying_why(tmp_path, small_fanout, instance):
    """No index yet, a torn record of the shard list, a record missing from its run: each tick is a
    skip that says why, never a failed tick (a sensor failing every 300 s) or a launch."""
    root = DataRoot(str(tmp_path / "root"))
    root.fs.makedirs(root.root, exist_ok=True)
    resources = {"data_root": DataRootResource(url=root.url)}

    def tick():
        return near_duplicates_compaction_sensor(dg.build_sensor_context(instance=instance, resources=resources))

    assert "no merge above level 2" in tick().skip_message  # no index yet
    four_shards_with_an_l1_merge_due(root, small_fanout)
    records = sorted(root.glob(f"{ORDER_LOG}/*.json"))
    last = root.fs.cat_file(records[-1])
    root.fs.pipe_file(records[-1], last[: len(last) // 2])
    torn = tick()
    assert isinstance(torn, dg.SkipReason) and "cannot be read" in torn.skip_message, torn.skip_message
    assert "repairs it" in torn.skip_message
    root.fs.pipe_file(records[-1], last)
    root.fs.rm_file(records[1])
    assert "cannot be read" in tick().skip_message
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, "²")
    with pytest.raises(ValueError, match=INLINE_MERGE_LEVEL_ENV):
        tick()
    with pytest.raises(ValueError, match=INLINE_MERGE_LEVEL_ENV):  # a shard's run: before any work
        run_near_duplicates(root, "during")
    assert not root.exists(layout.near_duplicates("during"))
    small_fanout.delenv(INLINE_MERGE_LEVEL_ENV)
    unlocked = {"data_root": DataRootResource(url="memory://speechdata-compaction-sensor")}
    skipped = near_duplicates_compaction_sensor(dg.build_sensor_context(instance=instance, resources=unlocked))
    assert "no exclusive create" in skipped.skip_message and "Launchpad" in skipped.skip_message
    lines = []
    assert not compact_pending(DataRoot("memory://speechdata-compaction-sensor"), on_progress=lines.append).merges
    assert lines and "no exclusive create" in lines[0] and "no near_duplicates step runs" in lines[0]


def test_the_sensor_launches_merges_the_shards_runs_left_when_its_inline_level_differs_from_theirs(
    tmp_path, small_fanout, instance
):
    """The daemon reads a higher inline level than the run workers: the merges between the two are
    nobody's by level, so a level that reaches twice ``FANOUT`` segments is launched anyway."""
    root = DataRoot(str(tmp_path / "root"))
    resources = {"data_root": DataRootResource(url=root.url)}
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, "0")  # the run workers: no merge at all
    for shard in SHARDS[:4]:
        run_near_duplicates(root, shard)
    assert levels(root) == ["L0"] * 4
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, "5")  # the daemon
    request = near_duplicates_compaction_sensor(dg.build_sensor_context(instance=instance, resources=resources))
    assert isinstance(request, dg.RunRequest), request
    assert request.tags[MERGE_TAG] == merges_due(root)[0].key


def test_a_compaction_that_waits_too_long_for_the_lock_fails_saying_what_to_do(tmp_path, small_fanout):
    root = DataRoot(str(tmp_path / "root"))
    resources = {"data_root": DataRootResource(url=root.url)}
    four_shards_with_an_l1_merge_due(root, small_fanout)
    # Closed here, not by the garbage collector: the context's ephemeral Dagster instance is the process's
    # current one until it is closed, and closed late (after the module's instance) it makes the module's
    # deleted instance current again, where the next module's definitions read it.
    with (
        dg.build_op_context(resources=resources, op_config={"lock_timeout_s": 0.2}) as context,
        corpus_index_lock(root),
        pytest.raises(dg.Failure) as failed,
    ):
        near_duplicates_compaction(context)
    message = failed.value.description  # the step's failure on the run's page, not a traceback
    assert "stayed locked" in message and "run the compaction again once that holder is done" in message
    assert "lock_timeout_s" in message
    assert levels(root) == ["L1", "L1", "L2"] and [due.level for due in merges_due(root)] == [
        1
    ]  # written, not switched
    assert [merge.level for merge in compact_pending(root).merges] == [1]
    assert levels(root) == ["L2"]


@pytest.mark.parametrize("torn", [".seg", ".seg.filter"])
def test_a_merged_segment_or_filter_torn_after_its_switch_leaves_the_decisions_as_they_were(
    tmp_path, small_fanout, torn
):
    intact, damaged = DataRoot(str(tmp_path / "intact")), DataRoot(str(tmp_path / "damaged"))
    for root in (intact, damaged):
        four_shards_with_an_l1_merge_due(root, small_fanout)
        compact_pending(root)
    [merged] = [name for name in segment_files(damaged) if name.endswith(torn)]
    path = damaged.path(f"{layout.NEAR_DUPLICATES_INDEX}/segments/{merged}")
    content = damaged.fs.cat_file(path)
    damaged.fs.pipe_file(path, content[: len(content) // 2])
    for root in (intact, damaged):
        run_near_duplicates(root, "during")  # copy-0005 of s2's orig-0005: found through the merged segment
    assert decision_files(damaged, ["during"]) == decision_files(intact, ["during"])
    assert b"s2" in decision_files(damaged, ["during"])["during/decisions"]
    assert_clean(damaged)


def test_a_compaction_killed_between_its_segment_and_its_filter_is_merged_again_whole(tmp_path, small_fanout):
    root = DataRoot(str(tmp_path / "root"))
    four_shards_with_an_l1_merge_due(root, small_fanout)

    def killed(relative):
        if relative.endswith(".filter"):
            raise Killed(relative)

    with small_fanout.context() as kill, pytest.raises(Killed):
        pause_merged_writes(kill, killed)
        compact_pending(root)
    assert levels(root) == ["L1", "L1", "L2"]  # the merged segment alone, named by no row
    assert [merge.level for merge in compact_pending(root).merges] == [1]
    small_fanout.setattr(near_dup_index_merge, "ORPHAN_GRACE_S", 0.0)
    compact_pending(root)
    assert levels(root) == ["L2"]
    assert_clean(root)


def test_a_compaction_while_a_shards_run_repairs_one_of_its_inputs_ends_clean(tmp_path, small_fanout):
    """One of the merge's inputs is torn after the job opened it, and a shard's run repairs the index
    (the input removed, its shards' level-0 segments rebuilt from their entries) before the job's
    switch: the job switches in nothing that holds torn postings, and the index ends clean, deciding
    as an intact one does."""
    intact, root = DataRoot(str(tmp_path / "intact")), DataRoot(str(tmp_path / "root"))
    for each in (intact, root):
        four_shards_with_an_l1_merge_due(each, small_fanout)
    compact_pending(intact)
    merge_segments = near_dup_index_merge.merge_segments
    repaired = []

    def torn_and_repaired_meanwhile(opened, *args):
        if not repaired:
            _, relative, _, _ = opened[0]
            path = root.path(relative)
            content = root.fs.cat_file(path)
            with open(path, "r+b") as handle:  # torn in place: the job's open handle reads it torn
                handle.truncate(len(content) // 2)
            repaired.append(repair_index(root))
        return merge_segments(opened, *args)

    small_fanout.setattr(near_dup_index_merge, "merge_segments", torn_and_repaired_meanwhile)
    compact_pending(root)
    small_fanout.setattr(near_dup_index_merge, "merge_segments", merge_segments)
    assert any("segment rebuilt from its entries" in line for line in repaired[0])
    small_fanout.setattr(near_dup_index_merge, "ORPHAN_GRACE_S", 0.0)
    compact_pending(root)
    assert repair_index(root) == []
    for each in (intact, root):
        run_near_duplicates(each, "during")
    assert decision_files(root, ["during"]) == decision_files(intact, ["during"])
    compact_pending(root)
    assert_clean(root)


def test_a_killed_writes_temporary_segment_is_swept_once_old_and_a_young_one_left(tmp_path, small_fanout):
    root = DataRoot(str(tmp_path / "root"))
    four_shards_with_an_l1_merge_due(root, small_fanout)
    folder = f"{layout.NEAR_DUPLICATES_INDEX}/segments"
    for name in ("._tmp-0123456789ab-L2-0000000000000000.seg", "._tmp-ba9876543210-L2-1111111111111111.seg"):
        root.write_bytes(f"{folder}/{name}", b"a merge killed while writing")
    an_hour_old(root, "._tmp-0123456789ab-L2-0000000000000000.seg")
    compact_pending(root)
    assert repair_index(root) == []  # a repair leaves both: temporary files are their writer's
    assert [name for name in segment_files(root) if name.startswith("._tmp-")] == [
        "._tmp-ba9876543210-L2-1111111111111111.seg"
    ]
    assert [name.split("-")[0] for name in segment_files(root) if name.startswith("L")] == ["L2", "L2"]


def test_the_sensor_on_an_index_of_the_earlier_layout_skips_and_the_job_leaves_it_to_the_shards(
    tmp_path, small_fanout, instance
):
    """An index of the layout before the shard list (one ``shards.parquet``, no segments): the tick
    skips, and a compaction run from the Launchpad anyway merges nothing and changes nothing (the
    next shard's run takes the layout over)."""
    import pyarrow as pa

    from speechdata.quality import near_dup_index

    root = DataRoot(str(tmp_path / "root"))
    four_shards_with_an_l1_merge_due(root, small_fanout)
    order = pa.Table.from_pylist([vars(s) for s in read_state(root)], schema=near_dup_index.ORDER_SCHEMA)
    root.write_parquet(
        layout.near_duplicates_index_order(), order.select(["position", "shard_id", "entries_version", "utterances"])
    )
    for folder in ("segments", "committed", "order"):
        root.fs.rm(root.path(f"{layout.NEAR_DUPLICATES_INDEX}/{folder}"), recursive=True)
    resources = {"data_root": DataRootResource(url=root.url)}
    tick = near_duplicates_compaction_sensor(dg.build_sensor_context(instance=instance, resources=resources))
    assert isinstance(tick, dg.SkipReason), tick
    before = sorted(root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/**"))
    assert compact_pending(root).merges == []
    assert sorted(root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/**")) == before
    run_near_duplicates(root, "during")
    assert [s.shard_id for s in read_state(root)] == [*SHARDS[:4], "during"]
