"""`make demo`: land the sample corpus in every landing form, build every product, print where things are.

The sample corpus (:mod:`speechdata.testing.demo_corpus`) is distinct synthesized speech: nothing in it
repeats or is broken except what it plants, and the demo names each plant and checks it was rejected
with its reason; any other reject is listed, and more than 5 % of them fail the demo. It ends with
commands to try, each of which works as printed (tests/integration/test_demo.py runs them).

Runs go into the project-local Dagster instance (``DAGSTER_HOME``), so ``make dev`` afterwards shows
them in the UI. The model profile is :data:`PROFILE` (``--profile`` overrides it): ``small``, a CTC
aligner trained on synthesized English and German speech, every other model tiny and random.

The terminal gets progress and the per-shard summary only: everything written to stderr (Dagster's
event log at DEBUG, library warnings, tracebacks) goes to ``<DAGSTER_HOME>/demo.log``, named at
the start and again when a step fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from assets.partitions import shard_partitions
from dagster_project.settings import data_root_url
from speechdata.bridge.manifest import manifest_path
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.demo_corpus import PLAIN_SHARD, DemoCorpus, land_demo_corpus

PROFILE = "small"
"""The model profile the demo runs (docs/models-and-profiles.md); ``make demo`` sets nothing else."""
MAX_UNPLANTED_REJECT_SHARE = 0.05
"""Rejects of sample utterances that are neither planted nor by a product's definition fail the demo above this."""


@contextlib.contextmanager
def stderr_to_file(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the block runs (Python, Dagster's loggers, C code)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", default=data_root_url(), help="fsspec URL of the data root")
    parser.add_argument("--log", help="where Dagster's event log goes (default: <DAGSTER_HOME>/demo.log)")
    parser.add_argument("--profile", default=PROFILE, help=f"model profile (default: {PROFILE})")
    args = parser.parse_args(argv)
    os.environ["SPEECHDATA_PROFILE"] = args.profile
    log_path = Path(args.log or Path(os.environ.get("DAGSTER_HOME") or tempfile.gettempdir()) / "demo.log")
    log_path.unlink(missing_ok=True)
    print(f"Dagster's event log (DEBUG and up) and warnings go to {log_path}", flush=True)
    try:
        with stderr_to_file(log_path):
            status = _demo(args)
    except BaseException:
        print(f"The demo stopped with an error: see the end of {log_path}", flush=True)
        raise
    if status:
        print(f"Something failed: the details are in {log_path}", flush=True)
    return status


def _demo(args) -> int:
    from assets.partitions import add_partition_keys, country_partitions, language_partitions
    from dagster_project.definitions import build_resources, defs

    data_root = DataRoot(args.data_root)
    print(f"Data root: {data_root.uri('')}")
    with _sources_dir(data_root) as sources:
        corpus = land_demo_corpus(data_root, sources)
    for shard_id in corpus.shards:
        print(f"Landed {shard_id}: {data_root.uri(layout.landing_dir(shard_id))}")

    instance = dg.DagsterInstance.get()
    add_partition_keys(instance, shard_partitions, corpus.shards)
    # Registered before any job, as the landing sensor does: language_shard_index runs per language.
    add_partition_keys(instance, country_partitions, corpus.countries)
    add_partition_keys(instance, language_partitions, corpus.languages)
    job = defs.resolve_job_def("per_shard_job")
    resources = build_resources(data_root=args.data_root, profile=os.environ["SPEECHDATA_PROFILE"])
    failed = False
    for shard_id in corpus.shards:
        started = time.perf_counter()
        print(
            f"-> {shard_id}: per_shard_job running (ingest, alignment, grids, features, tars, manifest)...", flush=True
        )
        result = job.execute_in_process(
            partition_key=shard_id,
            instance=instance,
            resources=resources,
            raise_on_error=False,
            tags={"speechdata/launched_by": "demo"},
            run_config={"loggers": {"console": {"config": {"log_level": "DEBUG"}}}},
        )
        status = "ok" if result.success else "FAILED"
        failed |= not result.success
        print(f"\n== {shard_id}: per_shard_job {status} in {time.perf_counter() - started:.1f} s (run {result.run_id})")
        _print_shard_summary(data_root, shard_id)
    commands: list[str] = []
    if data_root.is_local:
        bridge_tars = data_root.path(f"{layout.BRIDGE}/{PLAIN_SHARD}-*.tar")
        commands.append(
            ".venv/bin/python -c 'import glob, speechdata; "
            f'ds = speechdata.bridge_dataset(sorted(glob.glob("{bridge_tars}")), languages=["en"]); '
            'print(next(iter(ds))["json"]["words"][:3])\''
        )
    failed |= not _publish_hf_dataset(data_root, corpus.countries, instance, resources, defs, commands)
    failed |= not _run_the_other_products(data_root, corpus.languages, instance, resources, defs, commands)
    # Last, after every job: the accounting counts what each product's run wrote (translation, HF,
    # ASR, VAD), so `speechdata catalog --named shard_accounting` is current without a --refresh.
    failed |= not _refresh_catalog(instance, resources, defs)
    _print_catalog(resources["catalog"], data_root, corpus, commands, _data_root_option(args.data_root))
    _print_pseudo_labels(data_root, corpus, commands, _data_root_option(args.data_root))
    failed |= not _print_rejects_against_plants(data_root, corpus, resources["aligner"].models)
    print("\n== Try these")
    for command in commands:
        print(f"   {command}")
    print(
        "\nBrowse the runs, lineage and metadata: make dev, then open http://localhost:3000"
        f"\nDagster instance: {instance.root_directory}"
    )
    return 1 if failed else 0


@contextlib.contextmanager
def _sources_dir(data_root: DataRoot) -> Iterator[str]:
    """Where the demo writes the corpora it imports (aligned-JSON countries, a Granary parquet, a
    language tar): beside the data it lands when the root is local, else a temporary directory."""
    if data_root.is_local:
        yield data_root.path("_demo_sources")
    else:
        with tempfile.TemporaryDirectory() as directory:
            yield directory


def _data_root_option(data_root: str) -> str:
    """What a printed command needs to find this data root: nothing when it is the default one."""
    return "" if data_root == data_root_url() else f" --data-root {data_root}"


def _publish_hf_dataset(data_root: DataRoot, countries: list[str], instance, resources, defs, commands) -> bool:
    """Build each aligned-JSON country's HF dataset config (the shards are indexed by now)."""
    from speechdata.hf.card import CARD_FILE

    dataset = resources["hf_dataset_settings"].dataset
    ok = True
    for country in countries:
        result = defs.resolve_job_def("hf_dataset_job").execute_in_process(
            partition_key=country,
            instance=instance,
            resources=resources,
            raise_on_error=False,
            tags={"speechdata/launched_by": "demo"},
            run_config={"loggers": {"console": {"config": {"log_level": "DEBUG"}}}},
        )
        ok &= result.success
        print(f"== {country}: hf_dataset_job {'ok' if result.success else 'FAILED'}")
    dataset_dir = data_root.path(layout.hf_dataset_dir(dataset))
    print(f"\n== Hugging Face dataset {data_root.uri(layout.hf_dataset_dir(dataset))} (card: {CARD_FILE})")
    for path in sorted(data_root.fs.glob(f"{dataset_dir}/*/*.parquet")):
        print(f"   {path[len(dataset_dir) + 1 :]}  {data_root.fs.size(path) / 1e6:.2f} MB")
    for country in countries:
        commands.append(
            f'.venv/bin/python -c \'import datasets; print(datasets.load_dataset("{dataset_dir}", "{country}"))\''
        )
    if not resources["hub"].enabled:
        print(
            "Publishing to the Hub is off: set SPEECHDATA_HF_REPO_ID and HF_TOKEN to turn it on"
            " (docs/hf-splits.md, Publishing to the Hub)."
        )
    return ok


def _demo_segmentation(text: str) -> dict:
    """A stand-in for the LLM's chunking: English words in runs of 2 / 4 / all, each
    "translated" as a numbered placeholder. The demo shows the mechanics, not a translation."""
    words = text.split()

    def level(size: int) -> dict:
        chunks = [" ".join(words[i : i + size]) for i in range(0, len(words), size)]
        return {"English": chunks, "Chinese": [f"译{i}" for i in range(len(chunks))]}

    return {"low_latency": level(2), "medium_latency": level(4), "high_latency": level(max(len(words), 1))}


def _run_the_other_products(data_root: DataRoot, languages: list[str], instance, resources, defs, commands) -> bool:
    """Streaming translation for demo-0001's English, the ASR manifest, the per-language VAD index."""
    import json

    from assets import ALL_ASSETS
    from assets.asr_training import asr_manifest
    from assets.vad import language_shard_index

    shard_id = PLAIN_SHARD
    index = data_root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id", "language", "text"])
    for utt_id, language, text in zip(*(index[c].to_pylist() for c in ("utt_id", "language", "text")), strict=True):
        if language == "en" and text:
            data_root.write_bytes(
                f"{layout.landing_segmentation_dir(shard_id)}/{utt_id}.json",
                json.dumps(_demo_segmentation(text), ensure_ascii=False).encode(),
            )
    logged = {"loggers": {"console": {"config": {"log_level": "DEBUG"}}}}
    ok = True
    result = defs.resolve_job_def("translation_job").execute_in_process(
        partition_key=shard_id,
        instance=instance,
        resources=resources,
        raise_on_error=False,
        tags={"speechdata/launched_by": "demo"},
        run_config=logged,
    )
    ok &= result.success
    print(
        f"\n== {shard_id}: translation_job {'ok' if result.success else 'FAILED'} "
        f"(pairs: {data_root.uri(layout.streaming_pairs(shard_id))})"
    )
    result = dg.materialize(
        ALL_ASSETS,
        selection=[asr_manifest],
        instance=instance,
        resources=resources,
        raise_on_error=False,
        tags={"speechdata/launched_by": "demo"},
    )
    ok &= result.success
    print(f"== asr_manifest {'ok' if result.success else 'FAILED'} ({data_root.uri('asr/manifests')})")
    for language in languages:
        result = dg.materialize(
            ALL_ASSETS,
            selection=[language_shard_index],
            partition_key=language,
            instance=instance,
            resources=resources,
            raise_on_error=False,
            tags={"speechdata/launched_by": "demo"},
        )
        ok &= result.success
        print(
            f"== language_shard_index[{language}] {'ok' if result.success else 'FAILED'} "
            f"({data_root.uri(layout.language_shard_index_dir(language))})"
        )
    commands.append(
        ".venv/bin/python -c 'from speechdata.vad.language_index import build_urls; "
        f'print(build_urls(["en"], "{data_root.uri("")}"))\''
    )
    commands.append(
        f".venv/bin/python -c 'import polars; print(polars.read_parquet(\"{data_root.uri(layout.streaming_pairs(shard_id))}\"))'"
    )
    return ok


def _refresh_catalog(instance, resources, defs) -> bool:
    print("\n-> manifest_catalog_job running...", flush=True)
    result = defs.resolve_job_def("manifest_catalog_job").execute_in_process(
        instance=instance,
        resources=resources,
        raise_on_error=False,
        tags={"speechdata/launched_by": "demo"},
        run_config={"loggers": {"console": {"config": {"log_level": "DEBUG"}}}},
    )
    print(f"== manifest_catalog_job {'ok' if result.success else 'FAILED'}")
    return result.success


def _print_catalog(catalog, data_root: DataRoot, corpus: DemoCorpus, commands: list[str], root_option: str) -> None:
    from speechdata.catalog.display import format_table
    from speechdata.catalog.queries import NAMED_QUERIES, run_query
    from speechdata.io.duckdb_object_store import enable_data_root_reads

    print(f"\n== Catalog {catalog.database} (hours per language, from DuckDB)")
    with catalog.get_connection() as connection:
        enable_data_root_reads(connection, data_root)  # the views resolve files under the root it names
        print(format_table(run_query(connection, NAMED_QUERIES["hours_per_language"])))
        shards = ", ".join(f"'{shard_id}'" for shard_id in corpus.shards)
        accounting = run_query(
            connection, f"SELECT * FROM ({NAMED_QUERIES['shard_accounting']}) WHERE shard IN ({shards})"
        )
        print("\n== Accounting per shard and product (state: balanced, unbalanced or not built)")
        print(format_table(accounting))
    commands.append(f".venv/bin/speechdata catalog --named hours_per_language{root_option}")
    commands.append(f".venv/bin/speechdata catalog --named shard_accounting{root_option}")


def _print_pseudo_labels(data_root: DataRoot, corpus: DemoCorpus, commands: list[str], root_option: str) -> None:
    """Every utterance landed without text that the aligner transcribed (``text_source`` ``asr``): where
    the label was published (the bridge shard manifest, hence the tar's JSON and the catalog), or the
    reason each product rejected it. Nothing is loosened for the demo: labels that fail an honest
    threshold are shown failing it."""
    from speechdata.alignment.pseudo_labels import read_pseudo_labels

    print("\n== Pseudo-labels: utterances landed without text, transcribed by the aligner (text_source asr)")
    shown = passed = 0
    for shard_id in corpus.shards:
        labels = read_pseudo_labels(data_root, shard_id)
        if not labels:
            continue
        published = set()
        if data_root.exists(manifest_path(shard_id)):
            manifest = data_root.read_parquet(manifest_path(shard_id), columns=["key", "text_source"])
            published = {
                k
                for k, source in zip(*(manifest[c].to_pylist() for c in ("key", "text_source")), strict=True)
                if source == "asr"
            }
        rejected: dict[str, list[str]] = {}
        for path in sorted(data_root.glob(f"{layout.rejects_dir(shard_id)}/[!.]*.parquet")):
            stage = path.rsplit("/", 1)[-1].removesuffix(".parquet")
            table = data_root.read_parquet(layout.rejects(shard_id, stage), columns=["utt_id", "reason"])
            for utt_id, reason in zip(table["utt_id"].to_pylist(), table["reason"].to_pylist(), strict=True):
                if utt_id in labels:
                    rejected.setdefault(utt_id, []).append(f"{stage}: {reason}")
        print(
            f"   {shard_id}: {len(labels)} labelled, {len(published)} published in the bridge manifest "
            f"{data_root.uri(manifest_path(shard_id))} (and its tars' .json: text, text_source, asr_confidence); "
            f"the labels: {data_root.uri(layout.alignment_scores(shard_id))} (asr_text, asr_confidence)"
        )
        passed += len(published)
        for utt_id, (text, confidence) in sorted(labels.items()):
            where = "published" if utt_id in published else "; ".join(rejected.get(utt_id, ["not packed"]))
            print(f"     {utt_id} confidence {confidence:.2f} {text[:40]!r} -> {where}")
            shown += 1
    if not shown:
        print("   none: no utterance landed without text was transcribed")
    elif not passed:
        print(
            "   no label passed: this profile's aligner transcribes too poorly for honest thresholds (each "
            "reject and its reason above); no threshold is lowered for the demo"
        )
    commands.append(f".venv/bin/speechdata catalog --named pseudo_labels_per_shard{root_option}")


def _print_rejects_against_plants(data_root: DataRoot, corpus: DemoCorpus, aligned_languages) -> bool:
    """Every reject of the sample shards is either planted (named here) or counted as a surprise;
    surprises above :data:`MAX_UNPLANTED_REJECT_SHARE` of the landed utterances fail the demo."""
    from speechdata.testing.demo_corpus import sort_rejects

    print("\n== Planted defects (each must be rejected with its reason)")
    report = sort_rejects(data_root, corpus, aligned_languages)
    for plant in corpus.planted:
        print(f"   {plant.describe()}: {'rejected' if plant in report.caught else 'NOT REJECTED'}")
    for why, count in report.by_design.items():
        print(f"   by design, {count} utterances: {why}")
    share = report.unexpected_utterances / max(report.landed, 1)
    print(
        f"   other rejected utterances: {report.unexpected_utterances} of {report.landed} sample utterances ({share:.1%}); "
        "every reject is counted in the accounting above, with its reason in the shard's rejects files"
    )
    for shard_id, utt_id, stage, reason in report.unexpected:
        print(f"     {shard_id}/{utt_id} [{stage}] {reason}")
    missed = [plant for plant in corpus.planted if plant not in report.caught]
    return not missed and share < MAX_UNPLANTED_REJECT_SHARE


def _print_shard_summary(data_root: DataRoot, shard_id: str) -> None:
    landed = data_root.read_parquet(layout.landing_metadata(shard_id), columns=["utt_id"]).num_rows
    print(f"   landed utterances: {landed}")
    if data_root.exists(layout.utterance_index(shard_id)):
        index = data_root.read_parquet(layout.utterance_index(shard_id), columns=["duration_s"])
        hours = sum(index["duration_s"].to_pylist()) / 3600
        print(f"   indexed: {index.num_rows} ({hours:.4f} h)  {data_root.uri(layout.utterance_index(shard_id))}")
    if data_root.exists(layout.normalized_audio(shard_id)):
        audio = data_root.read_parquet(layout.normalized_audio(shard_id), columns=["duration_s"])
        hours = sum(audio["duration_s"].to_pylist()) / 3600
        print(f"   24 kHz audio: {audio.num_rows} ({hours:.4f} h)  {data_root.uri(layout.normalized_audio(shard_id))}")
    for path in sorted(data_root.fs.glob(data_root.path(f"{layout.BRIDGE}/{shard_id}-*.tar"))):
        print(f"   bridge tar: {data_root.fs.unstrip_protocol(path)}")
    if data_root.exists(manifest_path(shard_id)):
        print(f"   manifest: {data_root.uri(manifest_path(shard_id))}")
    rejects_dir = data_root.path(layout.rejects_dir(shard_id))
    if data_root.fs.exists(rejects_dir):
        for path in sorted(data_root.fs.glob(f"{rejects_dir}/[!.]*.parquet")):
            stage = path.rsplit("/", 1)[-1].removesuffix(".parquet")
            table = data_root.read_parquet(f"{layout.rejects_dir(shard_id)}/{stage}.parquet")
            reasons = dict(sorted(Counter(table["reason"].to_pylist()).items()))
            print(f"   rejects [{stage}]: {table.num_rows} {reasons}  {data_root.uri(layout.rejects(shard_id, stage))}")


if __name__ == "__main__":
    sys.exit(main())
