"""Attacks at the landing edge: symlinked shard parts, re-landings the clock cannot see, a missing
root, and two runs of one shard at once. Each test drives the real sensor or asset."""

import os
import shutil

import dagster as dg
import pytest

from assets.partitions import shard_partitions
from sensors.landing import build_landing_sensor
from speechdata.accounting.ledgers import landed_utterances
from speechdata.io import layout
from speechdata.io.confinement import DataRootMissing, LandedShardOutsideRoot, confined_landed_shard
from speechdata.io.storage import DataRoot
from speechdata.landing.contract import ContractError
from speechdata.landing.ingest import run_raw_shards
from speechdata.landing.landed_audio import LandedAudio
from tests.conftest import encode, land_shard, tone
from tests.integration.test_attacks_confinement import rejects_of, snapshot
from tests.integration.test_landing_sensor import tick

WAV = encode(tone(1.0, 16_000), 16_000)
ROWS = [{"utt_id": "a", "audio_path": "a.wav", "country": "us"}, {"utt_id": "b", "audio_path": "b.wav"}]


def land_two_files(data_root, shard_id, *, as_tar=False):
    land_shard(data_root, shard_id, ROWS, {"a.wav": WAV, "b.wav": WAV}, as_tar=as_tar)


def a_shard_outside(tmp_path, data_root, name="elsewhere", *, as_tar=False):
    """A complete shard written outside the data root (its own root, same layout)."""
    outside = DataRoot(str(tmp_path / name))
    land_two_files(outside, "x", as_tar=as_tar)
    return outside, tmp_path / name / "landing" / "x"


def raw_shards_failure(data_root, tiny_resources, shard_id):
    from assets.ingest import raw_shards

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
        result = dg.materialize(
            [raw_shards], partition_key=shard_id, instance=instance, resources=tiny_resources, raise_on_error=False
        )
        assert not result.success
        [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        checks = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
        return str(failure.event_specific_data.error), checks


# Confinement of a landed shard as a whole


@pytest.mark.parametrize("part", ["audio", "audio.tar", "metadata.parquet", "_SUCCESS"])
def test_a_shard_part_linked_out_of_the_root_fails_the_shard_by_name_and_is_never_read(data_root, tmp_path, part):
    outside, outside_shard = a_shard_outside(tmp_path, data_root, as_tar=part == "audio.tar")
    land_two_files(data_root, "s1", as_tar=part == "audio.tar")
    target = data_root.path(f"landing/s1/{part}")
    shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
    os.symlink(outside_shard / part, target)
    before = snapshot(outside_shard)
    with pytest.raises(ContractError, match=rf"landed_shard_outside_root: refusing landed file 'landing/s1/{part}'"):
        run_raw_shards(data_root, "s1")
    with pytest.raises(LandedShardOutsideRoot, match="outside its shard folder"):
        LandedAudio(data_root, "s1")
    with pytest.raises(LandedShardOutsideRoot):
        landed_utterances(data_root, "s1")
    assert snapshot(outside_shard) == before
    assert not data_root.exists(layout.utterance_index("s1"))


def test_a_symlinked_shard_folder_is_registered_but_not_read_and_raw_shards_fails_it(
    data_root, tmp_path, tiny_resources
):
    _, outside_shard = a_shard_outside(tmp_path, data_root)
    os.makedirs(data_root.path("landing"))
    os.symlink(outside_shard, data_root.path("landing/s1"))
    with dg.instance_for_test() as instance:
        result = tick(build_landing_sensor(batch_shards=1), instance, data_root)
        # Still requested, so the failure shows on the shard; its metadata's country was never read.
        assert [r.run_key for r in result.run_requests] == ["s1"]
        assert instance.get_dynamic_partitions("country") == []
        assert '"outside_root": ["s1"]' in result.cursor
    error, checks = raw_shards_failure(data_root, tiny_resources, "s1")
    assert "breaks the landing contract" in error and "landed_shard_outside_root" in error
    assert "refusing landed shard folder 'landing/s1'" in error
    [check] = checks
    assert not check.passed and "landed_shard_outside_root" in check.metadata["landing_contract"].value


def test_a_symlinked_landing_folder_fails_every_shard_even_pointing_inside_the_root(data_root):
    land_two_files(data_root, "s1")
    os.rename(data_root.path("landing"), data_root.path("elsewhere"))
    os.symlink(data_root.path("elsewhere"), data_root.path("landing"))
    with pytest.raises(LandedShardOutsideRoot, match=r"resolves to .*elsewhere/s1.*a symlinked shard or landing"):
        confined_landed_shard(data_root.root, "s1")
    with pytest.raises(ContractError, match="landed_shard_outside_root"):
        run_raw_shards(data_root, "s1")


def test_audio_borrowed_from_another_shard_is_refused_whole_folder_or_file_by_file(data_root):
    land_two_files(data_root, "owner")
    # A whole audio/ folder that is another shard's: the shard fails.
    land_shard(data_root, "borrower", ROWS, {})
    shutil.rmtree(data_root.path("landing/borrower/audio"), ignore_errors=True)
    os.symlink(data_root.path("landing/owner/audio"), data_root.path("landing/borrower/audio"))
    with pytest.raises(ContractError, match="refusing landed file 'landing/borrower/audio'"):
        run_raw_shards(data_root, "borrower")
    # One file that is another shard's: that row is rejected, the rest of the shard is ingested.
    land_shard(data_root, "mixed", ROWS, {"a.wav": WAV})
    os.symlink(data_root.path("landing/owner/audio/b.wav"), data_root.path("landing/mixed/audio/b.wav"))
    index = run_raw_shards(data_root, "mixed").index
    assert index["utt_id"].to_pylist() == ["a"]
    assert rejects_of(data_root, "mixed")["b"][0] == "audio_path_escapes_shard"


def test_a_link_within_the_shard_folder_is_allowed(data_root):
    land_two_files(data_root, "s1")
    os.rename(data_root.path("landing/s1/metadata.parquet"), data_root.path("landing/s1/metadata-v2.parquet"))
    os.symlink("metadata-v2.parquet", data_root.path("landing/s1/metadata.parquet"))
    index = run_raw_shards(data_root, "s1").index
    assert index["utt_id"].to_pylist() == ["a", "b"]


def test_a_hard_link_to_a_file_outside_the_root_is_read_as_the_shards_own(data_root, tmp_path):
    """Not covered, by design (docs/reliability.md): a hard link is the same file under a name inside
    the root; no path leaves the root, and making it needed access to that file already."""
    land_shard(data_root, "s1", ROWS[:1], {})
    outside = tmp_path / "outside.wav"
    outside.write_bytes(WAV)
    os.makedirs(data_root.path("landing/s1/audio"))
    os.link(outside, data_root.path("landing/s1/audio/a.wav"))
    index = run_raw_shards(data_root, "s1").index
    assert index["utt_id"].to_pylist() == ["a"] and os.stat(outside).st_nlink == 2


def test_a_symlinked_shard_output_folder_fails_the_step_before_anything_is_written(data_root, tmp_path, tiny_resources):
    land_two_files(data_root, "s1")
    outside = tmp_path / "outputs"
    outside.mkdir()
    os.makedirs(data_root.path("shards"))
    os.symlink(outside, data_root.path("shards/s1"))
    error, _ = raw_shards_failure(data_root, tiny_resources, "s1")
    assert "refusing shard output folder 'shards/s1'" in error
    assert list(outside.iterdir()) == []


def test_vad_refuses_a_shard_whose_audio_was_linked_out_after_ingest(data_root, tmp_path, tiny_resources):
    from assets.ingest import normalized_audio, raw_shards
    from assets.vad import vad_segments

    _, outside_shard = a_shard_outside(tmp_path, data_root)
    land_two_files(data_root, "s1")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
        ok = dg.materialize(
            [raw_shards, normalized_audio], partition_key="s1", instance=instance, resources=tiny_resources
        )
        assert ok.success
        shutil.rmtree(data_root.path("landing/s1/audio"))
        os.symlink(outside_shard / "audio", data_root.path("landing/s1/audio"))
        result = dg.materialize(
            [vad_segments], partition_key="s1", instance=instance, resources=tiny_resources, raise_on_error=False
        )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "refusing landed file 'landing/s1/audio'" in str(failure.event_specific_data.error)


# A data root that is not there


def test_every_sensor_fails_its_tick_on_a_missing_root_naming_it(tmp_path):
    from resources.hub import HubPublisherResource
    from resources.storage import DataRootResource
    from sensors.catalog import catalog_refresh_sensor
    from sensors.publishing import country_dataset_sensor

    missing = str(tmp_path / "unmounted")
    bound = {"data_root": DataRootResource(url=missing), "hub": HubPublisherResource()}
    with dg.instance_for_test() as instance:
        with pytest.raises(DataRootMissing, match=rf"landing_sensor: data root '{missing}' does not exist"):
            tick(build_landing_sensor(batch_shards=1), instance, DataRoot(missing))
        for sensor in (catalog_refresh_sensor, country_dataset_sensor):
            with pytest.raises(DataRootMissing, match=rf"{sensor.name}: data root '{missing}' does not exist"):
                sensor(dg.build_sensor_context(instance=instance, resources=bound))
    assert not os.path.exists(missing)


def test_an_empty_existing_root_still_ticks_green(data_root):
    os.makedirs(data_root.root)
    with dg.instance_for_test() as instance:
        assert tick(build_landing_sensor(batch_shards=1), instance, data_root).run_requests == []


def test_cli_commands_that_read_a_root_refuse_a_missing_one(tmp_path, capsys):
    from speechdata.cli import run

    missing = str(tmp_path / "unmounted")
    assert run(["catalog", "--data-root", missing, "--named", "hours_per_shard"]) != 0
    assert f"data root '{missing}' does not exist" in capsys.readouterr().err
    assert run(["export", "nemo", "--data-root", missing, "--out", str(tmp_path / "out"), "--quiet"]) != 0
    assert f"export nemo: data root '{missing}' does not exist" in capsys.readouterr().err
    assert not os.path.exists(missing)


def test_an_importer_refuses_to_write_through_a_shard_folder_linked_out_of_the_root(data_root, tmp_path, clips):
    from speechdata.importers.segment_tars import build_segment_tar_sample, import_segment_tar_shard

    build_segment_tar_sample(str(tmp_path / "seed"), clips, n_segments=2)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.makedirs(data_root.path("landing"))
    os.symlink(outside, data_root.path("landing/asr-hi-0001"))
    with pytest.raises(LandedShardOutsideRoot, match="refusing landed shard folder 'landing/asr-hi-0001'"):
        import_segment_tar_shard(str(tmp_path / "seed"), data_root, "asr-hi-0001", language="hi")
    assert list(outside.iterdir()) == []
