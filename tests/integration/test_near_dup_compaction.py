"""The near-duplicate index's merges split between a shard's own run (small ones, up to the inline
level) and the compaction job (the rest): the same decisions, byte for byte, whatever the schedule;
a shard committed while the job merges keeps its decisions and its postings; a job killed midway and
run again leaves the clean index; the sensor launches one job per due merge and none while one runs.

Shards are real ``run_near_duplicates`` runs on planted speech whose signals are computed once for
the module (the audio decode is not what is tested), with ``FANOUT`` 2 so that a few shards reach
several levels."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.near_duplicates import near_duplicates_compaction_job
from resources.storage import DataRootResource
from sensors.near_duplicates import MERGE_TAG, near_duplicates_compaction_sensor
from speechdata import cli
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_repair, near_duplicates
from speechdata.quality.near_dup_compaction import (
    INLINE_MERGE_LEVEL_ENV,
    compact_pending,
    merges_due,
    merges_due_above,
)
from speechdata.quality.near_dup_index import read_state, repair_index
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


@pytest.fixture
def small_fanout(monkeypatch, planted):
    monkeypatch.setattr(near_dup_index_repair, "FANOUT", 2)
    monkeypatch.setattr(near_duplicates, "shard_signals", lambda data_root, shard_id: (planted[shard_id], [], 0.0))
    return monkeypatch


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
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, "1")
    for shard in SHARDS[:4]:
        run_near_duplicates(root, shard)
    assert [due.level for due in merges_due_above(root)] == [1]
    merge_segments = near_dup_index_repair.merge_segments
    committed_during = []

    def a_shard_commits_meanwhile(*args):
        if not committed_during:  # the job's merge has read its inputs' headers, not yet switched
            committed_during.append(run_near_duplicates(root, "during"))
        return merge_segments(*args)

    small_fanout.setattr(near_dup_index_repair, "merge_segments", a_shard_commits_meanwhile)
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
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, "1")
    for shard in SHARDS[:4]:
        run_near_duplicates(root, shard)
    expected = decision_files(root, SHARDS[:4])

    def killed(*args, **kwargs):
        raise Killed(where)

    with small_fanout.context() as kill, pytest.raises(Killed):
        kill.setattr(near_dup_index_repair, where, killed)
        compact_pending(root)
    small_fanout.setattr(near_dup_index_repair, "ORPHAN_GRACE_S", 0.0)
    assert not compact_pending(root).still_due
    assert levels(root) == ["L2"]
    assert_clean(root)
    for shard in SHARDS[:4]:
        run_near_duplicates(root, shard)
    assert decision_files(root, SHARDS[:4]) == expected


def test_the_sensor_launches_one_compaction_per_due_merge_and_none_while_one_runs(tmp_path, small_fanout):
    root = DataRoot(str(tmp_path / "root"))
    resources = {"data_root": DataRootResource(url=root.url)}
    small_fanout.setenv(INLINE_MERGE_LEVEL_ENV, "1")
    for shard in SHARDS[:2]:
        run_near_duplicates(root, shard)
    with dg.instance_for_test() as instance:
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
        done = near_duplicates_compaction_sensor(dg.build_sensor_context(instance=instance, resources=resources))
        assert isinstance(done, dg.SkipReason)
