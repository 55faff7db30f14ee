"""What one new shard costs each corpus-wide stage, against the size of the corpus already built.

Why: per-shard stages are independent, but a corpus-wide stage (near duplicates, the ASR manifest,
the per-country HF builds, the language index, the catalog) runs again whenever a shard lands. If
its work grows with the corpus, building a corpus of N shards costs N^2. This measures, for corpora
of ``--hours`` N (default 10, 100, 1 000 and 10 000 hours), the wall time, CPU time and peak RSS of
adding ONE shard of about 1 000 utterances to each stage, through the stage's own asset
(``dg.materialize`` in a fresh interpreter, the tiny model profile).

The corpus: one template shard of ``--utterances`` utterances is landed and built through every
per-shard asset once (cached under ``--workdir``; its near-duplicate file is written empty so that
its utterances reach every product, as distinct speech would). Shard k of the corpus is the template
with every string value and path naming the template's shard id renamed: the small tables
(utterances, ledgers, quality, VAD segments, manifests, FLAC index) are rewritten, the payloads that
no corpus-wide stage should read (normalized audio, features, alignments, bridge tars, FLAC files)
are hard links to the template's, so a 10 000-hour corpus costs a few GB of disk. The measured new
shard is a full copy, payloads included, with its own ids.

For each N, in order: the corpus is extended to N hours, every stage catches up once (reported as
``catch_up_s``: the first import of that many shards), then one new shard is added and every stage
runs once for it (``wall_s`` is the step's own time from Dagster's event; ``cpu_s`` and
``peak_rss_mb`` are the child process's). ``growth`` per stage = wall at the largest N / wall at
100 h (1 = flat per new shard; the corpus-scale target is <= 1.5).

Near duplicates are measured separately from synthetic index entries (``near_duplicates``: ``--nd-hours``,
up to 100 000 h), since clones of one template are all exact copies of each other, plus the wait of
the last of 16 shards that reach near duplicates at once against one alone. ``--nd-index HOURS=DIR``:
measure that size on hard-linked copies of an index built before (the 1 000 h one takes most of an
hour to build), with the page faults, anonymous and file-backed RSS and bytes read that tell the
lookup's terms apart.

``--stages``: a subset of the stages (``asr_manifest``, the combined files, is quadratic: leave it out
past 1 000 h). ``--reuse-corpus``: keep the corpus a previous run cloned under ``--workdir`` (and each
stage's state over it) and measure one more new shard on it, cloning only what it lacks (10 000 h is
20 minutes of cloning on two cores). ``SPEECHDATA_BENCH_PROFILE_DIR``: profile each stage's run.

Every stage runs on one Dagster instance per corpus (``corpus-<utterances>-dagster`` beside the
corpus, kept with it by ``--reuse-corpus``), as in a deployment: its event log holds every stage's
runs, and the measured new shard's catalogued assets (:func:`speechdata.products.catalogued_assets`,
those partitioned by shard) are recorded in it as materialized, as the shard's own runs would have.
So the catalog's measured refresh is the scoped one a deployment runs (only the shards materialized
since the last refresh), run first for the new shard as in a deployment (:func:`new_shard_order`).
Its catch-up, when shards were cloned since its last refresh, is the full listing of a first import
(``full: true``, reported in ``catch_up``); with nothing cloned it is a refresh with no new shard.
The catalog's figures say which (``listed``).

``--quick``: a template of 20 utterances and one long recording (0.05 h), corpora of one and two
template shards plus the measured new one, the template's build and every stage run in the benchmark's
own process (its imports paid once), for the smoke test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.report import RssSampler, emit, leave_measured, progress, ratio, stdout_to_stderr

TEMPLATE_SHARD = "tplshard-000000"
PAYLOAD_NAMES = (
    "audio_24k.parquet",
    "qwen_hidden_states.parquet",
    "wavlm_features.parquet",
    "frame_grids.parquet",
    "alignments.parquet",
)
"""Per-shard files hard-linked into corpus shards (their ids stay the template's): no corpus-wide
stage should read an old shard's payload."""

PAYLOAD_FOLDERS = ("bridge/", "asr/flac/", f"landing/{TEMPLATE_SHARD}/audio", f"shards/{TEMPLATE_SHARD}/ctm/")
PAYLOAD_MIN_BYTES = 4 << 20
"""Any larger per-shard file is a payload too (the VAD stage's audio tar, for one)."""

STAGES = {
    "asr_manifest": {"assets": ["asr_manifest"], "partition": None},
    "asr_manifest_parts_only": {
        "assets": ["asr_manifest"],
        "partition": None,
        "run_config": {"ops": {"asr_manifest": {"config": {"combined_files": False}}}},
    },
    "hf_country": {"assets": ["hf_split_assignments", "hf_dataset"], "partition": "country"},
    "language_shard_index": {"assets": ["language_shard_index"], "partition": "language"},
    "manifest_catalog": {"assets": ["manifest_catalog"], "partition": None},
}
"""Each corpus-wide stage: the assets materialized together, and which partition kind they run for
(the new shard's country or language). ``asr_manifest_parts_only``: the manifest published as its
per-shard parts alone (``combined_files: false``), the mode that scales past about 1 000 hours."""


def shard_name(k: int) -> str:
    return f"shard-{k:06d}"


# --- the template shard


def build_template(workdir: Path, utterances: int, long_recordings: int = 4, in_this_process: bool = False) -> Path:
    """Land and build the template shard (once per ``utterances`` and ``long_recordings``); returns its
    data root. In a fresh interpreter, or (``in_this_process``, the smoke run's shortcut) in this one."""
    root = workdir / f"template-{utterances}-{long_recordings}"
    stamp = root / ".built"
    if stamp.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    progress(f"building the template shard ({utterances} utterances) through every shard asset")
    if in_this_process:
        _build_template_child(str(root), utterances, long_recordings)
    else:
        _run_child(
            ["--build-template", str(root), "--utterances", str(utterances), "--long-recordings", str(long_recordings)]
        )
    stamp.write_text("ok")
    return root


def _build_template_child(root: str, utterances: int, long_recordings: int) -> None:
    import dagster as dg

    from assets import SHARD_ASSETS
    from assets.partitions import shard_partitions
    from speechdata.io import layout
    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_duplicates import NEAR_DUPLICATES_SCHEMA
    from speechdata.testing.shards import build_sample_shard

    data_root = DataRoot(root)
    build_sample_shard(data_root, TEMPLATE_SHARD, utterances, long_recordings=long_recordings, formats=("flac", "wav"))
    # The fixture clips repeat, so the real near-duplicate stage would reject most utterances; the
    # template stands for distinct speech, so its near-duplicate file is empty and the stage skipped.
    data_root.write_parquet(layout.near_duplicates(TEMPLATE_SHARD), NEAR_DUPLICATES_SCHEMA.empty_table())
    selection = [asset for asset in SHARD_ASSETS if asset.key.path[-1] != "near_duplicates"]
    resources = _resources(root)
    resources["quality_models"] = _template_quality_models(resources["quality_models"])
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [TEMPLATE_SHARD])
        result = dg.materialize(selection, partition_key=TEMPLATE_SHARD, instance=instance, resources=resources)
    if not result.success:
        raise SystemExit("the template shard did not build")


class _FixedMos:
    """The template's MOS. The tiny profile's SQUIM model takes about an hour for two hours of audio on
    two cores, and the corpus-wide stages read the score column, not the model behind it."""

    def mos(self, audios_16k) -> list[float]:
        return [3.5 for _ in audios_16k]


class _FixedDnsmos:
    """The template's DNSMOS: the real P.835 model costs about 140 CPU seconds per audio hour, and
    more than its share on a loaded machine; the corpus-wide stages read its columns only."""

    def score(self, audios_16k) -> list:
        from speechdata.quality.dnsmos import DnsmosScores

        return [DnsmosScores(3.5, 3.5, 3.5) if audio.size and audio.any() else None for audio in audios_16k]


def _fixed_speaker_encoder():
    """Resemblyzer with its LSTM replaced by one fixed direction (one speaker per utterance): the
    float64 encoder is most of the quality step's time (docs/performance.md, "Quality signals:
    speaker encoder"), and no corpus-wide stage reads an embedding."""
    import numpy as np

    from speechdata.quality.speakers import EMBEDDING_SIZE, SpeakerEncoder

    class FixedSpeakerEncoder(SpeakerEncoder):
        def _embed(self, mels):
            embeddings = np.zeros((len(mels), EMBEDDING_SIZE), np.float32)
            embeddings[:, 0] = 1.0
            return embeddings

    return FixedSpeakerEncoder("cpu")


def _template_quality_models(bound):
    from resources.quality import QualityModelsResource

    class TemplateQualityModels(QualityModelsResource):
        def speech_quality(self, device):
            return _FixedMos()

        def dnsmos(self):
            return _FixedDnsmos()

        def speaker_encoder(self, device):
            return _fixed_speaker_encoder()

    return TemplateQualityModels(**bound.model_dump())


def _resources(root: str) -> dict:
    from dagster_project.definitions import build_resources

    resources = build_resources(root, profile="tiny")
    cache = os.environ.get("SPEECHDATA_BENCH_MODEL_CACHE", str(Path(root).parent / "models"))
    for key, resource_ in resources.items():
        if "model_cache_dir" in getattr(type(resource_), "model_fields", {}):
            resources[key] = resource_.model_copy(update={"model_cache_dir": cache})
    resources["torch_device"] = resources["torch_device"].model_copy(update={"device": "cpu"})
    return resources


def template_files(template: Path) -> list[str]:
    """The template's per-shard files (relative paths naming the template shard)."""
    return sorted(
        str(path.relative_to(template))
        for path in template.rglob("*")
        if path.is_file() and TEMPLATE_SHARD in str(path.relative_to(template))
    )


def template_hours(template: Path) -> float:
    table = pq.read_table(template / "shards" / TEMPLATE_SHARD / "utterances.parquet", columns=["duration_s"])
    return float(pc.sum(table["duration_s"]).as_py() or 0.0) / 3600


# --- cloning


def _renamed(array: pa.Array, shard_id: str) -> pa.Array:
    """``array`` with the template's shard id renamed in every string it holds, lists and structs included."""
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.replace_substring(array, TEMPLATE_SHARD, shard_id)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = _renamed(array.values, shard_id)
        return type(array).from_arrays(array.offsets, values, mask=array.is_null() if array.null_count else None)
    if pa.types.is_struct(kind):
        children = [_renamed(array.field(i), shard_id) for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(
            children, fields=list(kind), mask=array.is_null() if array.null_count else None
        )
    return array


def _renamed_table(table: pa.Table, shard_id: str) -> pa.Table:
    columns = [
        pa.chunked_array([_renamed(chunk, shard_id) for chunk in column.chunks], type=column.type)
        for column in table.columns
    ]
    return pa.Table.from_arrays(columns, schema=table.schema)


def clone_shard(template: Path, files: list[str], root: Path, shard_id: str, *, full: bool) -> None:
    """Shard ``shard_id`` under ``root``: the template's files renamed (``full``: payloads rewritten
    too; else hard-linked)."""
    from speechdata.io.parquet_integrity import WRITE_OPTIONS

    for relative in files:
        source = template / relative
        target = root / relative.replace(TEMPLATE_SHARD, shard_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        payload = (
            os.path.basename(relative) in PAYLOAD_NAMES
            or relative.startswith(PAYLOAD_FOLDERS)
            or source.stat().st_size > PAYLOAD_MIN_BYTES
        )
        if payload and not full:
            # A shard a killed run left half cloned is cloned again over what it wrote.
            target.unlink(missing_ok=True)
            os.link(source, target)
        elif relative.endswith(".parquet"):
            table = pq.read_table(source)
            pq.write_table(_renamed_table(table, shard_id), target, **WRITE_OPTIONS)
        elif relative.endswith((".json", ".jsonl", ".txt", ".ctm")) or os.path.basename(relative) == "_SUCCESS":
            target.write_text(source.read_text().replace(TEMPLATE_SHARD, shard_id))
        else:
            shutil.copyfile(source, target)


def cloned_ledger(root: Path) -> Path:
    """The corpus shards whose every file is written, one id a line (beside the data root, so no stage
    lists it): what ``--reuse-corpus`` keeps."""
    return root.parent / f"{root.name}.cloned"


def cloned_shards(root: Path) -> list[str]:
    """The shards a previous run finished cloning into ``root``, in shard order."""
    ledger = cloned_ledger(root)
    if not ledger.exists():
        return []
    return sorted({line for line in ledger.read_text().splitlines() if line})


def clone_shards(template: Path, files: list[str], root: Path, shard_ids: list[str], workers: int) -> None:
    """The corpus's shards (hard-linked payloads), over ``workers`` processes: about 2.5 s a shard on
    one loaded core, so 10 000 h (4 760 shards) wants many."""
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    clone = partial(_clone_corpus_shard, template, files, root)
    if workers <= 1 or len(shard_ids) < 2:
        for shard_id in shard_ids:
            clone(shard_id)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(clone, shard_ids, chunksize=16))


def _clone_corpus_shard(template: Path, files: list[str], root: Path, shard_id: str) -> None:
    clone_shard(template, files, root, shard_id, full=False)
    # One short line appended whole (O_APPEND): workers cloning at once do not interleave.
    with open(cloned_ledger(root), "a") as ledger:
        ledger.write(shard_id + "\n")


# --- running a stage in a fresh interpreter


def _run_child(arguments: list[str]) -> dict:
    command = [sys.executable, "-m", "benchmarks.corpus.bench_corpus_scale", *arguments]
    completed = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "SPEECHDATA_PROFILE": "tiny"}
    )
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-6000:])
        raise SystemExit(f"{' '.join(arguments[:2])} failed (exit {completed.returncode})")
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def new_shard_order(stages: list[str]) -> list[str]:
    """The stages in the order a deployment runs them for a new shard: the catalog first (its sensor
    follows the shard's manifest), before the country's HF build. A catalog refresh after an HF
    build lists the root whole (the build's materialization names a country, not the shards it
    touched), so run after it the catalog would measure that listing, not the new shard's refresh."""
    return sorted(stages, key=lambda stage: stage != "manifest_catalog")


def instance_folder(root: Path) -> Path:
    """The corpus's Dagster instance (its ``DAGSTER_HOME``): beside the data root, not in it."""
    return root.parent / f"{root.name}-dagster"


def run_stages(
    root: Path,
    partitions: dict[str, list[str]],
    keys: dict[str, str],
    *,
    one_process: bool,
    stages: list[str] | None = None,
    first_import: bool = False,
    new_shard: str | None = None,
) -> dict:
    """One run of each of ``stages`` (default: every stage; for the new shard's country or language),
    each in a fresh interpreter (``one_process``, the smoke run's shortcut: all in this process,
    imports paid once per benchmark), on the corpus's instance: step wall, CPU, peak and added RSS,
    and the machine's load averages (1, 5, 15 min) as each stage started. ``first_import``: the
    catalog lists the root whole (``full: true``), as it must after shards it was never told of;
    ``new_shard``: recorded as materialized first."""
    stages = stages or list(STAGES)
    instance_folder(root).mkdir(exist_ok=True)
    if one_process:
        load = [round(value, 2) for value in os.getloadavg()]
        ran = _run_stages_child(
            stages,
            str(root),
            partitions,
            keys,
            str(instance_folder(root)),
            first_import=first_import,
            new_shard=new_shard,
        )
        return {stage: {**stage_figures, "load_avg": load} for stage, stage_figures in ran.items()}
    figures = {}
    for group in [[stage] for stage in stages]:
        load = [round(value, 2) for value in os.getloadavg()]
        ran = _run_child(
            ["--run-stages", ",".join(group), "--root", str(root), "--partitions", json.dumps(partitions)]
            + ["--keys", json.dumps(keys), "--instance-dir", str(instance_folder(root))]
            + (["--first-import"] if first_import else [])
            + (["--record-new-shard", new_shard] if new_shard else [])
        )
        new_shard = None  # recorded once, by the first child
        figures.update({stage: {**stage_figures, "load_avg": load} for stage, stage_figures in ran.items()})
    return figures


PROFILE_ENV = "SPEECHDATA_BENCH_PROFILE_DIR"
"""Where set, each stage's run is profiled (cProfile, in the child) into ``<dir>/<stage>-<shards>.prof``:
what a stage's time per new shard is spent on, at the size where it grows."""


FIRST_IMPORT_RUN_CONFIG = {"manifest_catalog": {"ops": {"manifest_catalog": {"config": {"full": True}}}}}
"""Per stage, its run config for a first import (the shards cloned since its last run were never
materialized in the instance): the catalog lists the root whole."""


def _run_stages_child(
    stages: list[str],
    root: str,
    partitions: dict[str, list[str]],
    keys: dict[str, str],
    instance_dir: str,
    *,
    first_import: bool = False,
    new_shard: str | None = None,
) -> dict:
    folder = os.environ.get(PROFILE_ENV)
    if new_shard:
        record_materialized(instance_dir, new_shard)
    figures = {}
    for stage in stages:
        run_config = (first_import and FIRST_IMPORT_RUN_CONFIG.get(stage)) or STAGES[stage].get("run_config")
        run = (_run_stage, stage, root, partitions, _key(STAGES[stage], keys), instance_dir, run_config)
        if not folder:
            figures[stage] = run[0](*run[1:])
            continue
        import cProfile

        profiler = cProfile.Profile()
        figures[stage] = profiler.runcall(*run)
        profiler.dump_stats(os.path.join(folder, f"{stage}-{len(partitions['shard'])}.prof"))
    return figures


def record_materialized(instance_dir: str, shard: str) -> None:
    """``shard``'s catalogued assets partitioned by shard recorded as materialized in the corpus's
    instance (runless events), as the shard's own runs would have: the catalog's next refresh reads
    them from the event log and looks at that shard alone."""
    import dagster as dg

    from assets import ALL_ASSETS
    from assets.partitions import shard_partitions
    from speechdata import products

    catalogued = set(products.catalogued_assets())
    by_shard = sorted(
        key.path[-1]
        for asset in ALL_ASSETS
        for key in asset.keys
        if key.path[-1] in catalogued and asset.partitions_def == shard_partitions
    )
    with dg.instance_for_test(temp_dir=instance_dir) as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [shard])
        for name in by_shard:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=name, partition=shard))


def _run_stage(
    stage: str,
    root: str,
    partitions: dict[str, list[str]],
    key: str | None,
    instance_dir: str,
    run_config: dict | None,
) -> dict:
    import dagster as dg

    from assets import ALL_ASSETS
    from speechdata import products

    wanted = set(STAGES[stage]["assets"])
    # The catalog tells the shard-partitioned catalogued assets from the assets its run was given,
    # as from a code location's: they come along, unselected (every asset would cost each run 0.3 s).
    given = wanted | (set(products.catalogued_assets()) if "manifest_catalog" in wanted else set())
    assets = [asset for asset in ALL_ASSETS if {key.path[-1] for key in asset.keys} & given]
    selected = [key for asset in assets for key in asset.keys if key.path[-1] in wanted]
    started_cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    # The corpus's instance, kept across runs: a stage that reads the event log (the catalog's
    # changed shards) sees what a deployment's would.
    with RssSampler() as rss, dg.instance_for_test(temp_dir=instance_dir) as instance:
        for kind, keys in partitions.items():
            instance.add_dynamic_partitions(kind, keys)
        result = dg.materialize(
            assets,
            selection=selected,
            partition_key=key or None,
            instance=instance,
            resources=_resources(root),
            run_config=run_config,
        )
        steps = [event for event in result.all_events if event.event_type_value == "STEP_SUCCESS"]
        step_seconds = sum(event.event_specific_data.duration_ms for event in steps) / 1000
        listed = [
            event.event_specific_data.materialization.metadata["listed"].value
            for event in result.all_events
            if event.event_type_value == "ASSET_MATERIALIZATION"
            and "listed" in event.event_specific_data.materialization.metadata
        ]
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - started_cpu.ru_utime - started_cpu.ru_stime
    if not result.success:
        raise SystemExit(f"{stage} failed")
    return {
        "wall_s": round(step_seconds, 3),
        "run_wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "peak_rss_mb": round(rss.peak_mb, 1),
        "added_rss_mb": round(rss.added_mb, 1),
        **({"listed": listed[0]} if listed else {}),
    }


# --- the corpus, grown N by N


def new_shard_partitions(template: Path) -> dict[str, str]:
    """The country and language the measured shard feeds (the template's most frequent ones)."""
    table = pq.read_table(template / "shards" / TEMPLATE_SHARD / "utterances.parquet", columns=["language", "country"])
    keys = {}
    for column in ("language", "country"):
        counts = pc.value_counts(pc.drop_null(table[column])).to_pylist()
        keys[column] = max(counts, key=lambda row: row["counts"])["values"]
    return keys


def measure(args: argparse.Namespace) -> dict:
    workdir = Path(args.workdir)
    template = build_template(workdir, args.utterances, args.long_recordings, in_this_process=args.quick)
    files = template_files(template)
    hours_per_shard = template_hours(template)
    keys = new_shard_partitions(template)
    root = workdir / f"corpus-{args.utterances}"
    shards: list[str] = []
    if args.reuse_corpus and root.exists():
        # The corpus a previous run built, and every stage's state over it; its measured new shards
        # stay in it (each is one shard more), and this run's new shard takes the next free id.
        shards = cloned_shards(root)
        progress(f"re-using the corpus under {root}: {len(shards)} shards")
    else:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(instance_folder(root), ignore_errors=True)
        cloned_ledger(root).unlink(missing_ok=True)
        root.mkdir(parents=True)
    per_hours = {}
    for hours in args.hours:
        wanted = max(1, math.ceil(hours / hours_per_shard))
        progress(f"corpus of {hours} h: {wanted} shards of {hours_per_shard:.2f} h")
        started = time.perf_counter()
        added = [shard_name(k) for k in range(len(shards), wanted)]
        clone_shards(template, files, root, added, args.clone_workers)
        shards += added
        cloned_s = time.perf_counter() - started
        partitions = {"shard": shards, "country": [keys["country"]], "language": [keys["language"]]}
        # Shards cloned since the last runs were never materialized in the instance: a first import.
        first_import = bool(added) or not instance_folder(root).exists()
        ran = run_stages(root, partitions, keys, one_process=args.quick, stages=args.stages, first_import=first_import)
        catch_up = {stage: figures["wall_s"] for stage, figures in ran.items()}
        new = shard_name(len(shards))
        clone_shard(template, files, root, new, full=True)
        with open(cloned_ledger(root), "a") as ledger:
            ledger.write(new + "\n")
        shards.append(new)
        partitions["shard"] = shards
        figures = run_stages(
            root, partitions, keys, one_process=args.quick, stages=new_shard_order(args.stages), new_shard=new
        )
        progress(f"  new shard at {hours} h: {figures}")
        per_hours[str(hours)] = {
            "shards": len(shards),
            "hours": round(len(shards) * hours_per_shard, 2),
            "clone_s": round(cloned_s, 2),
            "catch_up_s": catch_up,
            "catch_up": {stage: {k: v for k, v in f.items() if k != "load_avg"} for stage, f in ran.items()},
            "new_shard": figures,
        }
    return {"per_hours": per_hours, "hours_per_shard": round(hours_per_shard, 3)}


NEAR_DUPLICATE_SECONDS_PER_UTTERANCE = 4.8
"""The synthetic index's mean utterance (benchmarks/corpus/bench_near_duplicates_index.py)."""


def measure_near_duplicates(
    hours: list,
    utterances: int,
    baseline_max_hours: float = 1000,
    simultaneous: int = 16,
    prebuilt: dict[str, str] | None = None,
    scratch: str | None = None,
    fresh_processes: bool = True,
) -> dict:
    """Near duplicates per new shard against a synthetic index of each size, the postings index
    beside the whole-index scan it replaced (in the same run, on the same index). ``prebuilt``: size
    -> an index folder built before (``benchmarks.corpus.bench_near_duplicates_index.build_index``),
    measured on a hard-linked copy made under ``scratch`` per measurement instead of an index built
    here (a measurement commits its shard: the folder itself is never written). ``fresh_processes``
    False (the smoke run's shortcut): each build and measurement runs in this process, imports paid once."""
    import tempfile

    from benchmarks.corpus.bench_near_duplicates_index import (
        in_fresh_process,
        in_this_process,
        indexed_shards,
        measure_simultaneous,
        timed_build,
    )
    from benchmarks.corpus.bench_near_duplicates_index import measure as measure_index

    prebuilt = prebuilt or {}
    run = in_fresh_process if fresh_processes else in_this_process
    per_hours = {}
    with tempfile.TemporaryDirectory(prefix="bench-corpus-scale-near-dup-", dir=scratch) as folder:
        for size in hours:
            shards = max(2, math.ceil(size * 3600 / (utterances * NEAR_DUPLICATE_SECONDS_PER_UTTERANCE)))
            source = prebuilt.get(str(size))
            if source is None:
                url = f"{folder}/h{size}"
                built = run(timed_build, url, shards, utterances)
                figures = {"shards": shards, **built}
            else:
                figures = {"shards": indexed_shards(source), "index": source}

            # The baseline first: the postings path commits the new shard to the index.
            paths = (["baseline_whole_index"] if size <= baseline_max_hours else []) + ["postings_index"]
            for path in paths:
                copy = _measured_copy(source, folder, size, path, figures)
                figures.update(run(measure_index, copy, utterances, path))
                if source is not None:
                    shutil.rmtree(copy)
            if size == hours[-1] and simultaneous > 1:
                copy = _measured_copy(source, folder, size, "simultaneous", figures)
                figures["simultaneous"] = measure_simultaneous(copy, utterances, simultaneous)
                if source is not None:
                    shutil.rmtree(copy)
            progress(f"near duplicates at {size} h ({shards} shards): {figures}")
            per_hours[str(size)] = figures
    return per_hours


def _measured_copy(source: str | None, folder: str, size, label: str, figures: dict) -> str:
    """Where to measure ``label`` at ``size``: the index built here (``source`` None), or a fresh
    hard-linked copy of the prebuilt ``source`` (its seconds noted in ``figures``)."""
    if source is None:
        return f"{folder}/h{size}"
    copy = f"{folder}/h{size}-{label}"
    figures.setdefault("copy_s", {})[label] = link_copy(source, copy)
    return copy


def link_copy(source: str, destination: str) -> float:
    """Copy the index folder ``source`` to ``destination`` as hard links (a new directory tree whose
    files are the same inodes), falling back to a full copy across file systems; the seconds it took.
    Safe for a near-duplicate index: every index write is a new file moved into place
    (``speechdata.io.atomic_writes``) and every removal unlinks a name, so a measurement on the copy
    never changes a file the source holds (docs/performance.md)."""
    started = time.perf_counter()
    completed = subprocess.run(["cp", "-al", source, destination], capture_output=True, text=True)
    if completed.returncode != 0:
        shutil.rmtree(destination, ignore_errors=True)
        shutil.copytree(source, destination)
    return round(time.perf_counter() - started, 2)


def _key(spec: dict, keys: dict[str, str]) -> str | None:
    return keys[spec["partition"]] if spec["partition"] else None


def growth(per_hours: dict, stage: str, base: str = "100", figure: str = "wall_s") -> float | None:
    sizes = list(per_hours)
    base = base if base in per_hours else sizes[0]
    return ratio(per_hours[sizes[-1]]["new_shard"][stage][figure], per_hours[base]["new_shard"][stage][figure])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hours", default="10,100,1000,10000")
    parser.add_argument("--utterances", type=int, default=1000)
    parser.add_argument("--long-recordings", type=int, default=4, help="the template's recordings of three clips")
    parser.add_argument("--nd-hours", default="10,100,1000", help="near-duplicate index sizes (hours)")
    parser.add_argument("--nd-utterances", type=int, default=1000)
    parser.add_argument("--skip-stages", action="store_true", help="near duplicates only")
    parser.add_argument("--skip-near-duplicates", action="store_true", help="the other corpus-wide stages only")
    parser.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="the corpus-wide stages measured, comma-separated (asr_manifest, the combined files, is "
        "quadratic: minutes at 1 000 h, so leave it out past that)",
    )
    parser.add_argument(
        "--reuse-corpus",
        action="store_true",
        help="keep the corpus a previous run cloned under --workdir (and its stages' state), clone "
        "only the shards it lacks, and measure a new shard on it",
    )
    parser.add_argument("--clone-workers", type=int, default=os.cpu_count() or 1, help="processes cloning shards")
    parser.add_argument(
        "--nd-baseline-max-hours",
        type=float,
        default=1000,
        help="the whole-index scan baseline up to this size (13 GB of memory at 1 000 h; 0: none)",
    )
    parser.add_argument(
        "--nd-simultaneous",
        type=int,
        default=16,
        help="new shards reaching near duplicates at once, at the largest size",
    )
    parser.add_argument(
        "--nd-index",
        action="append",
        default=[],
        metavar="HOURS=DIR",
        help="measure the near-duplicate size HOURS on hard-linked copies of the index DIR (built before by "
        "bench_near_duplicates_index.build_index) instead of building one; repeat per size",
    )
    parser.add_argument("--nd-scratch", help="where the near-duplicate indexes (or their copies) are made")
    parser.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "speechdata-corpus-scale"))
    parser.add_argument("--build-template", help=argparse.SUPPRESS)
    parser.add_argument("--run-stages", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--partitions", help=argparse.SUPPRESS)
    parser.add_argument("--keys", help=argparse.SUPPRESS)
    parser.add_argument("--instance-dir", help=argparse.SUPPRESS)
    parser.add_argument("--first-import", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--record-new-shard", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_template:
        with stdout_to_stderr():
            _build_template_child(args.build_template, args.utterances, args.long_recordings)
        return
    if args.run_stages:
        with stdout_to_stderr():
            figures = _run_stages_child(
                args.run_stages.split(","),
                args.root,
                json.loads(args.partitions),
                json.loads(args.keys),
                args.instance_dir,
                first_import=args.first_import,
                new_shard=args.record_new_shard,
            )
        print(json.dumps(figures), flush=True)
        leave_measured()
    if args.quick:
        # The template build (every shard asset, tiny models) is most of the smoke run: half of the
        # former 40 utterances and four long recordings, with the corpus sizes halved to keep one and two shards.
        args.utterances, args.long_recordings, args.hours = 20, 1, "0.02,0.08"
        args.nd_hours, args.nd_utterances, args.nd_simultaneous = "0.05,0.2", 40, 2
        os.environ["SPEECHDATA_PROFILE"] = "tiny"  # the stages run here, with the profile their children get
    args.hours = _sizes(args.hours)
    args.stages = args.stages.split(",")
    unknown = sorted(set(args.stages) - set(STAGES))
    if unknown:
        parser.error(f"--stages: no stage {', '.join(unknown)} (known: {', '.join(STAGES)})")
    args.nd_hours = _sizes(args.nd_hours)
    with stdout_to_stderr():
        figures = {} if args.skip_stages else measure(args)
        near = (
            {}
            if args.skip_near_duplicates
            else measure_near_duplicates(
                args.nd_hours,
                args.nd_utterances,
                args.nd_baseline_max_hours,
                args.nd_simultaneous,
                prebuilt=dict(_prebuilt(text, parser) for text in args.nd_index),
                scratch=args.nd_scratch,
                fresh_processes=not args.quick,
            )
        )
    per_hours = figures.get("per_hours", {})
    nd_sizes = list(near)
    growths = {stage: growth(per_hours, stage) for stage in args.stages} if per_hours else {}
    # CPU beside wall: on a shared machine the wall time of one run is mostly the neighbours' load.
    growths_cpu = {stage: growth(per_hours, stage, figure="cpu_s") for stage in args.stages} if per_hours else {}
    if near:
        growths["near_duplicates"] = ratio(
            near[nd_sizes[-1]]["postings_index"]["wall_s"],
            near["100" if "100" in near else nd_sizes[0]]["postings_index"]["wall_s"],
        )
    emit(
        "corpus_scale",
        {
            "hours": args.hours,
            "utterances_per_shard": args.utterances,
            "nd_hours": args.nd_hours,
            "stages": args.stages,
            "nd_index": args.nd_index,
            "code": os.path.dirname(__import__("speechdata").__file__),
        },
        {**figures, "near_duplicates": near, "growth": growths, "growth_cpu": growths_cpu},
    )


def _prebuilt(text: str, parser: argparse.ArgumentParser) -> tuple[str, str]:
    hours, _, folder = text.partition("=")
    if not folder or not os.path.isdir(os.path.join(folder, "index", "near_duplicates")):
        parser.error(f"--nd-index {text}: not HOURS=DIR with a near-duplicate index in DIR")
    return str(_sizes(hours)[0]), os.path.abspath(folder)


def _sizes(text: str) -> list:
    return [float(h) if "." in h else int(h) for h in text.split(",")]


if __name__ == "__main__":
    main()
