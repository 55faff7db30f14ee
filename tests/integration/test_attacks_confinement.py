"""Attacks on confinement and ids: symlinks, hostile partition keys, long ids, importer sources, tars.

Each test asserts the exact reject reason or error text, and that nothing outside the root changed.
"""

import gzip
import io
import json
import os
import tarfile

import dagster as dg
import pytest

from assets.partitions import shard_partitions
from speechdata.importers.aligned_json import import_aligned_countries
from speechdata.io import layout
from speechdata.io.confinement import ConfinementError, confined_path, validate_partition_key
from speechdata.landing.contract import MAX_UTT_ID_LENGTH, ContractError
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.aligned_json import build_aligned_json_corpus
from tests.conftest import encode, land_shard, tone


def snapshot(directory) -> dict[str, tuple[int, int]]:
    """Every file under ``directory`` with its size and mtime: "nothing outside was touched"."""
    found = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            stat = os.lstat(path)
            found[path] = (stat.st_size, stat.st_mtime_ns)
    return found


def rejects_of(data_root, shard_id, stage="raw_shards"):
    table = data_root.read_parquet(layout.rejects(shard_id, stage))
    return {r["utt_id"]: (r["reason"], r["detail"]) for r in table.to_pylist()}


def test_a_symlink_out_of_the_shard_is_rejected_and_never_read(data_root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.wav"
    secret.write_bytes(encode(tone(1.0, 16_000), 16_000))
    land_shard(
        data_root,
        "links",
        [{"utt_id": "ok", "audio_path": "ok.wav"}, {"utt_id": "sneaky", "audio_path": "sub/secret.wav"}],
        {"ok.wav": encode(tone(1.0, 16_000), 16_000)},
    )
    os.makedirs(data_root.path("landing/links/audio/sub"))
    os.symlink(secret, data_root.path("landing/links/audio/sub/secret.wav"))
    before = snapshot(outside)
    summary = run_raw_shards(data_root, "links")
    index = summary.index
    reason, detail = rejects_of(data_root, "links")["sneaky"]
    assert reason == "audio_path_escapes_shard"
    assert "refusing audio_path 'sub/secret.wav'" in detail and "outside its root" in detail
    assert index["utt_id"].to_pylist() == ["ok"]
    assert snapshot(outside) == before


def test_rejects_name_landed_files_relative_to_the_root_never_by_its_absolute_path(data_root, tmp_path):
    outside = tmp_path / "outside.wav"
    outside.write_bytes(encode(tone(1.0, 16_000), 16_000))
    land_shard(
        data_root,
        "named",
        [
            {"utt_id": "ok", "audio_path": "ok.wav"},
            {"utt_id": "missing", "audio_path": "gone/missing.wav"},
            {"utt_id": "linked", "audio_path": "link.wav"},
        ],
        {"ok.wav": encode(tone(1.0, 16_000), 16_000)},
    )
    os.symlink(outside, data_root.path("landing/named/audio/link.wav"))
    run_raw_shards(data_root, "named")
    rejects = rejects_of(data_root, "named")
    assert rejects["missing"] == (
        "audio_not_found",
        "metadata row 1: landing/named/audio/gone/missing.wav does not exist",
    )
    reason, detail = rejects["linked"]
    assert reason == "audio_path_escapes_shard"
    assert "refusing audio_path 'link.wav'" in detail and "(root 'landing/named/audio')" in detail
    root = data_root.root.rstrip("/")
    assert not [detail for _, detail in rejects.values() if root in detail]


def test_an_unreadable_tar_member_is_rejected_without_naming_the_tar_by_its_absolute_path(data_root):
    members = [("ok.wav", encode(tone(1.0, 16_000), 16_000)), ("noise.wav", b"RIFF not audio at all" * 40)]
    land_tar(
        data_root,
        "tarred",
        tar_of(members),
        [{"utt_id": "ok", "audio_path": "ok.wav"}, {"utt_id": "bad", "audio_path": "noise.wav"}],
    )
    index = run_raw_shards(data_root, "tarred").index
    assert index["utt_id"].to_pylist() == ["ok"]
    reason, detail = rejects_of(data_root, "tarred")["bad"]
    assert (
        reason == "audio_unreadable"
        and detail == "metadata row 1: noise.wav: Error opening the file: Format not recognised."
    )
    assert data_root.root.rstrip("/") not in detail and "ExFileObject" not in detail and "the file" in detail


def test_a_symlinked_folder_is_refused_by_the_guard(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(tmp_path, root / "up")
    with pytest.raises(ConfinementError, match=r"refusing audio_path 'up/x': resolves to .*outside its root"):
        confined_path(str(root), "up/x", what="audio_path")
    with pytest.raises(ConfinementError, match="found a '..', '.' or empty path component"):
        confined_path(str(root), "a/../../x", what="audio_path")


def test_a_hand_added_hostile_partition_key_fails_before_writing(data_root, tiny_resources, tmp_path):
    from assets.vad import vad_segments

    before = snapshot(tmp_path)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["../../x"])
        result = dg.materialize(
            [vad_segments], partition_key="../../x", instance=instance, resources=tiny_resources, raise_on_error=False
        )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "refusing shard id '../../x': a shard id must match" in str(failure.event_specific_data.error)
    assert snapshot(tmp_path) == before
    assert not os.path.exists(tmp_path.parent / "x")
    with pytest.raises(ConfinementError):
        validate_partition_key("a/b")


def test_an_over_long_utt_id_is_a_reject_and_the_longest_valid_id_is_written(data_root, tiny_resources):
    from assets.alignment import alignments
    from assets.asr_training import asr_flac
    from assets.ingest import normalized_audio, raw_shards

    longest, too_long = "a" * MAX_UTT_ID_LENGTH, "b" * 240
    audio = encode(tone(1.5, 16_000), 16_000)
    land_shard(
        data_root,
        "longids",
        [
            {"utt_id": longest, "audio_path": "a.wav", "text": "hello world", "language": "en"},
            {"utt_id": too_long, "audio_path": "a.wav", "text": "hello world", "language": "en"},
        ],
        {"a.wav": audio},
    )
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["longids"])
        result = dg.materialize(
            [raw_shards, normalized_audio, alignments, asr_flac],
            partition_key="longids",
            instance=instance,
            resources=tiny_resources,
        )
    assert result.success
    reason, detail = rejects_of(data_root, "longids")[too_long]
    assert reason == "utt_id_too_long" and "240 characters is longer than 200" in detail
    flac_index = data_root.read_parquet(layout.asr_flac_index("longids")).to_pylist()
    [longest_flac] = [r["flac_path"] for r in flac_index if r["utt_id"] == longest]
    assert data_root.exists(longest_flac)
    assert data_root.exists(layout.ctm("longids", "words", longest))


def test_importer_sources_outside_the_source_folder_are_refused(data_root, tmp_path, clips):
    countries = tmp_path / "countries"
    build_aligned_json_corpus(countries, {"de": 2}, clips=clips, audio_format="flac")
    outside = tmp_path / "outside.flac"
    outside.write_bytes((next((countries / "de" / "audio").iterdir())).read_bytes())
    jsons = sorted((countries / "de/Alignment/alignment_output").glob("*_aligned.json"))
    for path, audio_file in zip(jsons, ["/etc/hostname", "../../outside.flac"]):
        document = json.loads(path.read_text())
        document["audio_file"] = audio_file
        path.write_text(json.dumps(document))
    before = snapshot(tmp_path / "countries") | {str(outside): os.lstat(outside)[6:7]}
    [report] = import_aligned_countries(str(countries), data_root, ["de"])
    assert set(report.refused_recordings) == {"/etc/hostname", "../../outside.flac"}
    assert "refusing audio_file '/etc/hostname'" in report.refused_recordings["/etc/hostname"]
    assert "outside the source folder" in report.refused_recordings["../../outside.flac"]
    landed = [p for p in data_root.fs.find(data_root.path("landing")) if "/audio/" in p]
    assert landed == []  # neither file was copied in
    assert snapshot(tmp_path / "countries") | {str(outside): os.lstat(outside)[6:7]} == before


def tar_of(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def land_tar(data_root, shard_id, tar_bytes, rows):
    data_root.write_bytes(layout.landing_audio_tar(shard_id), tar_bytes)
    land_shard(data_root, shard_id, rows, {})


def test_duplicate_tar_member_names_are_rejected_as_ambiguous(data_root):
    one, two = encode(tone(1.0, 16_000), 16_000), encode(tone(2.0, 16_000), 16_000)
    land_tar(
        data_root,
        "dups",
        tar_of([("a.wav", one), ("a.wav", two), ("b.wav", one)]),
        [{"utt_id": "a", "audio_path": "a.wav"}, {"utt_id": "b", "audio_path": "b.wav"}],
    )
    index = run_raw_shards(data_root, "dups").index
    reason, detail = rejects_of(data_root, "dups")["a"]
    assert reason == "tar_member_duplicate" and "'a.wav' appears more than once: ambiguous" in detail
    assert index["utt_id"].to_pylist() == ["b"]


def test_a_gzipped_audio_tar_fails_the_shard_with_one_clear_message(data_root):
    audio = encode(tone(1.0, 16_000), 16_000)
    land_tar(data_root, "gz", gzip.compress(tar_of([("a.wav", audio)])), [{"utt_id": "a", "audio_path": "a.wav"}])
    with pytest.raises(ContractError, match="audio.tar is gzip-compressed: land an uncompressed tar"):
        run_raw_shards(data_root, "gz")


def test_a_truncated_audio_tar_keeps_its_intact_members(data_root):
    members = [(f"{n}.wav", encode(tone(1.0, 16_000, 200 + n), 16_000)) for n in range(3)]
    whole = tar_of(members)
    cut = whole[: len(whole) - 1024 - 20_000]  # the end blocks and most of the last member's data
    land_tar(data_root, "cut", cut, [{"utt_id": f"u{n}", "audio_path": f"{n}.wav"} for n in range(3)])
    index = run_raw_shards(data_root, "cut").index
    assert index["utt_id"].to_pylist() == ["u0", "u1"]
    reason, detail = rejects_of(data_root, "cut")["u2"]
    assert reason == "tar_member_truncated" and "'2.wav': the tar ends inside it" in detail
