"""Launch the near-duplicate index's compaction job when a merge too large for a shard's own run is due.

A shard's run merges only segments creating up to ``SPEECHDATA_NEAR_DUP_INLINE_MERGE_LEVEL`` (default
2); a merge above it waits for ``near_duplicates_compaction_job``. Each tick reads the shard list's
head and records (``speechdata.quality.near_dup_compaction.merges_due_above_or_damage``: no segment, the same
reads at 100 shards and at 100 000) and one page of this job's runs. It launches nothing while a run
of the job is queued, starting or running (that run merges everything due, lowest level first); each
launch's run key names the merge it is for, so a tick repeated launches nothing twice. A merge whose
job failed is launched again, at most :data:`MAX_ATTEMPTS` times in all (then the tick says so: fix
what failed, and launch the job from the Launchpad).
"""

import os

import dagster as dg

from assets.near_duplicates import COMPACTION_JOB_NAME
from resources.storage import DataRootResource
from speechdata.io.confinement import require_existing_root
from speechdata.io.shard_lock import EXCLUSIVE_CREATE_PROTOCOLS
from speechdata.quality.near_dup_compaction import inline_merge_level, merges_due_above_or_damage

SENSOR_NAME = "near_duplicates_compaction_sensor"
MERGE_TAG = "speechdata/near_duplicates_merge"
"""The key of the merge a launched run is for (:attr:`~speechdata.quality.near_dup_compaction.DueMerge.key`)."""
MAX_ATTEMPTS = 3
_IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


@dg.sensor(
    name=SENSOR_NAME,
    job_name=COMPACTION_JOB_NAME,
    minimum_interval_seconds=int(os.environ.get("SPEECHDATA_NEAR_DUP_COMPACTION_SENSOR_INTERVAL_S", "300")),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Launches near_duplicates_compaction_job when the near-duplicate index has a merge due above the "
    "level a shard's run merges (SPEECHDATA_NEAR_DUP_INLINE_MERGE_LEVEL), unless a run of it is in progress.",
)
def near_duplicates_compaction_sensor(
    context: dg.SensorEvaluationContext, data_root: DataRootResource
) -> dg.RunRequest | dg.SkipReason:
    level = inline_merge_level()  # a bad value fails every tick, naming the variable
    root = data_root.get()
    # An unmounted root has no index: fail the tick, naming the root, rather than report nothing due.
    require_existing_root(root.root, local=root.is_local, what=SENSOR_NAME)
    if not (root.is_local or root.protocol in EXCLUSIVE_CREATE_PROTOCOLS):
        # There a compaction's switch is unlocked: it would race the shards' commits.
        return dg.SkipReason(
            f"the data root's store ({root.protocol}) has no exclusive create, so the index is updated without "
            f"its lock: launch {COMPACTION_JOB_NAME} from the Launchpad while no near_duplicates step runs"
        )
    if context.instance.get_run_records(dg.RunsFilter(job_name=COMPACTION_JOB_NAME, statuses=_IN_PROGRESS), limit=1):
        return dg.SkipReason(f"a {COMPACTION_JOB_NAME} run is in progress")
    due, damage = merges_due_above_or_damage(root, level)
    if not due:
        if damage is not None:
            return dg.SkipReason(
                f"the near-duplicate index's shard list cannot be read ({damage}): the next shard's "
                f"near_duplicates run repairs it, then a due merge is launched"
            )
        return dg.SkipReason(f"no merge above level {level} is due")
    merge = due[0]
    earlier = context.instance.get_run_records(dg.RunsFilter(tags={MERGE_TAG: merge.key}), limit=MAX_ATTEMPTS)
    if len(earlier) >= MAX_ATTEMPTS:
        return dg.SkipReason(
            f"the merge of {merge.waiting} L{merge.level} segments ({merge.key}) was launched {len(earlier)} times "
            f"and is still due: see those runs, then launch {COMPACTION_JOB_NAME} from the Launchpad"
        )
    return dg.RunRequest(
        run_key=f"near-dup-compact-{merge.key}-{len(earlier) + 1}",
        tags={"speechdata/launched_by": SENSOR_NAME, MERGE_TAG: merge.key},
    )


defs = dg.Definitions(sensors=[near_duplicates_compaction_sensor])
