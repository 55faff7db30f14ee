"""`make demo` leaves the catalog current: its refresh runs after every other job of the demo."""

import argparse
from types import SimpleNamespace

import dagster as dg
import pytest

import dagster_project.definitions as definitions
from dagster_project import demo
from speechdata.testing.demo_corpus import DemoCorpus


class RecordedJob:
    def __init__(self, name, runs):
        self.name, self.runs = name, runs

    def execute_in_process(self, **kwargs):
        self.runs.append(self.name)
        return SimpleNamespace(success=True, run_id=f"run-of-{self.name}")


@pytest.mark.slow
def test_the_demo_refreshes_the_catalog_after_its_last_job(tmp_path, monkeypatch):
    runs: list[str] = []
    fake_defs = SimpleNamespace(resolve_job_def=lambda name: RecordedJob(name, runs))
    monkeypatch.setattr(definitions, "defs", fake_defs)
    monkeypatch.setattr(
        definitions, "build_resources", lambda **kwargs: {"catalog": None, "aligner": SimpleNamespace(models={})}
    )
    monkeypatch.setattr(dg.DagsterInstance, "get", staticmethod(dg.DagsterInstance.ephemeral))
    corpus = DemoCorpus(shards=["demo-0001", "demo-0002"], countries=["de"], languages=["de", "en"])
    monkeypatch.setattr(demo, "land_demo_corpus", lambda *args, **kwargs: corpus)
    monkeypatch.setattr(demo, "_print_shard_summary", lambda *args: None)
    monkeypatch.setattr(demo, "_print_rejects_against_plants", lambda *args: True)
    monkeypatch.setattr(demo, "_print_catalog", lambda *args: runs.append("print catalog"))

    def product_jobs(name):
        def run(data_root, keys, instance, resources, defs, commands):
            defs.resolve_job_def(name).execute_in_process()
            return True

        return run

    # The jobs these two run (hf_dataset_job per country; translation_job, asr_manifest, the VAD
    # index) write files the accounting counts.
    monkeypatch.setattr(demo, "_publish_hf_dataset", product_jobs("hf_dataset_job"))
    monkeypatch.setattr(demo, "_run_the_other_products", product_jobs("translation_job"))

    status = demo._demo(argparse.Namespace(data_root=str(tmp_path / "data")))

    assert status == 0
    assert runs.count("manifest_catalog_job") >= 1
    last_refresh = len(runs) - 1 - runs[::-1].index("manifest_catalog_job")
    assert "translation_job" in runs and "hf_dataset_job" in runs
    assert runs[:last_refresh].count("translation_job") == runs.count("translation_job")
    assert runs[:last_refresh].count("hf_dataset_job") == runs.count("hf_dataset_job")
    assert runs[last_refresh + 1 :] == ["print catalog"]
