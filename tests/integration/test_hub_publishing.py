"""Publishing to a local stand-in for the Hub: interrupted runs resume without duplicating anything."""

import logging

import dagster as dg
import pytest
from huggingface_hub import HfApi

import speechdata.hf.publish as hf_publish
from assets.partitions import country_partitions
from assets.publishing import hf_hub_upload
from resources.hub import HfDatasetSettings, HubPublisherResource
from speechdata.hf.assignment import refresh_split_assignments
from speechdata.hf.card import write_dataset_card
from speechdata.hf.dataset import DatasetOptions, build_country_dataset
from speechdata.hf.publish import RetryPolicy, publish_country, register_card
from speechdata.hf.splits import SplitTargets
from speechdata.hf.state import state_connection
from speechdata.importers.aligned_json import import_aligned_countries
from speechdata.io import layout
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.aligned_json import build_aligned_json_corpus
from tests.hub_standin import CommitFailure, HubStandIn
from tests.tiny_resources import tiny_resources_for

DATASET = "ds"
TOKEN = "hf_do_not_log_me_123"
FAST_RETRIES = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.02)


def land_and_build(corpus, data_root, targets=SplitTargets(), max_file_mb=500.0):
    for report in import_aligned_countries(str(corpus), data_root):
        for shard in report.shards:
            run_raw_shards(data_root, shard)
    refresh_split_assignments(data_root, DATASET, "de", targets=targets)
    build_country_dataset(data_root, "de", DatasetOptions(dataset=DATASET, max_file_mb=max_file_mb))
    write_dataset_card(data_root, DATASET)
    register_card(data_root, DATASET, "de")


@pytest.fixture
def corpus(tmp_path, clips):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 4}, clips=clips, audio_format="flac")
    return corpus


@pytest.fixture
def built(corpus, data_root):
    land_and_build(corpus, data_root)
    return data_root


def local_files(data_root) -> dict[str, bytes]:
    base = data_root.path(layout.hf_dataset_dir(DATASET))
    return {p[len(base) + 1 :]: data_root.fs.cat_file(p) for p in data_root.fs.find(base)}


def file_statuses(data_root) -> dict[str, str]:
    with state_connection(data_root, layout.hf_state_database(DATASET, "de")) as db:
        return dict(db.execute("SELECT path_in_repo, status FROM files").fetchall())


def segment_statuses(data_root) -> set[str]:
    with state_connection(data_root, layout.hf_state_database(DATASET, "de")) as db:
        return {s for (s,) in db.execute("SELECT DISTINCT status FROM segments WHERE file IS NOT NULL").fetchall()}


def run(data_root, hub, **kwargs):
    api = HfApi(endpoint=hub.url, token=TOKEN)
    return publish_country(data_root, DATASET, "de", api, "org/ds", policy=FAST_RETRIES, log=lambda m: None, **kwargs)


def only(paths, prefix: str) -> str:
    """The one path starting with ``prefix`` (file names end with a content hash)."""
    [found] = [p for p in paths if p.startswith(prefix)]
    return found


def test_failed_split_is_recorded_then_a_rerun_uploads_only_the_rest_once(built):
    with HubStandIn() as hub:
        hub.state.failures.append(CommitFailure("validation", times=3, status=503))
        first = run(built, hub)
        statuses = file_statuses(built)
        validation = only(statuses, "de/validation-00000-of-00001-")
        assert statuses[validation] == "error"
        assert "503" in first.errors[validation]
        assert statuses[only(statuses, "de/test-00000-of-00001-")] == "uploaded"
        assert hub.state.failed_commits == 3  # retried with backoff before giving up

        second = run(built, hub)
        assert second.errors == {}
        assert second.committed == [validation]
        assert hub.state.repos["org/ds"] == local_files(built)
        assert all(count == 1 for count in hub.state.commit_count_by_path.values())
        assert set(file_statuses(built).values()) == {"uploaded"}
        assert segment_statuses(built) == {"uploaded"}
        assert hub.state.authorizations == {f"Bearer {TOKEN}"}


def test_crash_after_the_hub_accepted_a_commit_does_not_upload_it_again(built, monkeypatch):
    real_mark = hf_publish._mark_uploaded
    calls = []

    def crash_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise KeyboardInterrupt("worker killed between the commit and the state update")
        return real_mark(*args, **kwargs)

    with HubStandIn() as hub:
        monkeypatch.setattr(hf_publish, "_mark_uploaded", crash_once)
        with pytest.raises(KeyboardInterrupt):
            run(built, hub)
        assert len(hub.state.commits) == 1 and "pending" in file_statuses(built).values()
        monkeypatch.setattr(hf_publish, "_mark_uploaded", real_mark)
        again = run(built, hub)
        assert again.already_on_hub == hub.state.commits[0]["paths"]
        assert hub.state.repos["org/ds"] == local_files(built)
        assert all(count == 1 for count in hub.state.commit_count_by_path.values())
        assert set(file_statuses(built).values()) == {"uploaded"}


def test_a_new_shard_adds_files_beside_the_published_ones_and_a_rewritten_part_replaces_its_old_files_on_the_hub(
    corpus, built, clips
):
    with HubStandIn() as hub:
        run(built, hub)
        old = only(file_statuses(built), "de/validation-00000-of-00001-")
        assert old in hub.state.repos["org/ds"]
        # New recordings, most of them validation, written in small files: the new shard's part of
        # validation is several files, added beside the published one, which stays as it is.
        build_aligned_json_corpus(corpus, {"de": 3}, clips=clips, audio_format="flac", first_recording=10)
        land_and_build(corpus, built, targets=SplitTargets(test=0.01, validation=0.6), max_file_mb=0.05)
        assert file_statuses(built)[old] == "uploaded"
        added = run(built, hub)
        assert len([p for p in added.committed if p.startswith("de/validation-")]) >= 2 and not added.deleted
        # A near duplicate found after its part was published: the part is rewritten without it and
        # its old file deleted on the Hub in the same commit.
        with state_connection(built, layout.hf_state_database(DATASET, "de")) as db:
            db.execute(
                "UPDATE segments SET status = 'filtered', reason = 'near_duplicate' "
                "WHERE key = (SELECT min(key) FROM segments WHERE file = ?)",
                [old],
            )
        build_country_dataset(built, "de", DatasetOptions(dataset=DATASET))
        write_dataset_card(built, DATASET)
        register_card(built, DATASET, "de")
        assert file_statuses(built)[old] == "deleted"
        result = run(built, hub)
        assert old in result.deleted
        assert hub.state.repos["org/ds"] == local_files(built)
        assert old not in file_statuses(built) and set(file_statuses(built).values()) == {"uploaded"}


def test_hf_hub_upload_asset_never_logs_the_token(built, caplog):
    with dg.instance_for_test() as instance, HubStandIn() as hub, caplog.at_level(logging.DEBUG):
        instance.add_dynamic_partitions(country_partitions.name, ["de"])
        result = dg.materialize(
            [hf_hub_upload],
            partition_key="de",
            instance=instance,
            resources=tiny_resources_for(
                built.url,
                hf_dataset_settings=HfDatasetSettings(dataset=DATASET),
                hub=HubPublisherResource(repo_id="org/ds", token=TOKEN, endpoint=hub.url, retry_base_delay_s=0.01),
            ),
        )
        assert result.success
        [event] = result.asset_materializations_for_node("hf_hub_upload")
        assert event.metadata["files_committed"].value == len(local_files(built))
        logs = "\n".join(str(e) for e in instance.all_logs(result.run_id)) + caplog.text
        assert "committing" in logs and TOKEN not in logs
