"""ASR shard import (FLAC tar and audio index), safe tar reading and 16 kHz FLAC extraction, then the manifest on that shard."""

import io
import os
import tarfile

import polars as pl
import pyarrow as pa
import pytest
import soundfile as sf

from speechdata.asr.flac import run_asr_flac
from speechdata.asr.manifest import AsrManifestConfig
from speechdata.asr.stage import build_and_write_asr_manifests
from speechdata.importers.segment_tars import build_segment_tar_sample, import_segment_tar_shard, segment_tar_to_landing
from speechdata.io import layout
from speechdata.io.safe_tar import audit_tar, contained_path, member_name_problem
from speechdata.landing.extras import unpack_extras
from speechdata.landing.ingest import run_raw_shards


def tar_with(members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r:")


def member(name, data=b"", kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def test_audit_rejects_escaping_names_links_and_devices():
    audit = audit_tar(
        tar_with(
            [
                member("ok/a.flac", b"x"),
                member("./b.flac", b"y"),
                member("../escape.flac", b"z"),
                member("/etc/abs.flac", b"z"),
                member("link.flac", kind=tarfile.SYMTYPE, link="/etc/passwd"),
                member("hard.flac", kind=tarfile.LNKTYPE, link="ok/a.flac"),
                member("dev", kind=tarfile.CHRTYPE),
                member("twice.flac", b"x"),
                member("twice.flac", kind=tarfile.SYMTYPE, link="/etc/shadow"),
            ]
        )
    )
    assert set(audit.files) == {"ok/a.flac", "b.flac"}
    assert {name: m.reason for name, m in audit.unsafe.items()} == {
        "../escape.flac": "tar_member_unsafe_path",
        "/etc/abs.flac": "tar_member_unsafe_path",
        "link.flac": "tar_member_is_link",
        "hard.flac": "tar_member_is_link",
        "dev": "tar_member_is_device",
        "twice.flac": "tar_member_is_link",
    }


def test_output_paths_cannot_leave_their_root():
    assert contained_path("/data/asr", "flac/s/u.flac") == "/data/asr/flac/s/u.flac"
    for bad in ("../x.flac", "/x.flac", "flac/../../x"):
        assert member_name_problem(bad) is not None
        with pytest.raises(ValueError):
            contained_path("/data/asr", bad)


def test_seed_columns_map_to_the_landing_contract():
    metadata = pl.DataFrame(
        {
            "segment_id": ["vid1_seg.0001", "vid1_seg_0002", "x"],
            "transcription_native": ["a", "b", "c"],
            "duration_s": [1.0, 2.0, 3.0],
            "tx_quality_score": [0.9, 0.8, 0.7],
            "segment_language": ["HI", None, "ta"],
        }
    )
    index = pl.DataFrame(
        {
            "segment_id": ["vid1_seg.0001", "vid1_seg_0002", "vid1_seg_0002"],
            "tar_member_name": ["1.flac", "2.flac", "dup.flac"],
        }
    )
    landed = segment_tar_to_landing(metadata, index, language="as", source="shard_7")
    assert landed["utt_id"].to_list() == ["vid1_seg_0001", "vid1_seg_0002", "x"]
    assert landed["audio_path"].to_list() == ["1.flac", "2.flac", None]  # no index entry: raw_shards rejects it
    assert landed["language"].to_list() == ["hi", "as", "ta"]
    assert landed["recording_id"].to_list() == [None, "vid1_seg", None]
    assert landed["declared_duration_s"].to_list() == [1.0, 2.0, 3.0]
    assert landed["segment_id"][0] == "vid1_seg.0001" and "tx_quality_score" in landed.columns


@pytest.fixture
def imported_shard(tmp_path, data_root, clips):
    source = str(tmp_path / "seed" / "shard_0001")
    escape = {"../escape.flac": b"not audio", "rec000_0000.flac/../../../escape2.flac": b"nope"}
    build_segment_tar_sample(source, clips, n_segments=12, extra_members=escape)
    import_segment_tar_shard(source, data_root, "asr-0001")
    return data_root


def test_extraction_writes_16k_mono_flac_and_never_escapes(tmp_path, imported_shard):
    data_root = imported_shard
    run_raw_shards(data_root, "asr-0001")
    summary = run_asr_flac(data_root, "asr-0001")
    unsafe = summary.unsafe_members
    assert summary.rows_out == 12 and summary.rejects == []
    assert {m.reason for m in unsafe} == {"tar_member_unsafe_path"} and len(unsafe) == 2
    assert not list(tmp_path.rglob("escape*"))
    index = data_root.read_parquet(layout.asr_flac_index("asr-0001"))
    for path, n_samples in zip(index["flac_path"].to_pylist(), index["n_samples"].to_pylist()):
        info = sf.info(data_root.path(path))
        assert (info.samplerate, info.channels, info.frames) == (16_000, 1, n_samples)


def test_an_utterance_pointing_at_an_unsafe_member_is_rejected_with_the_reason(tmp_path, imported_shard):
    data_root = imported_shard
    run_raw_shards(data_root, "asr-0001")
    # Bypass the landing contract (which already refuses '..' paths) to prove the extractor holds alone.
    index = pl.from_arrow(data_root.read_parquet(layout.utterance_index("asr-0001")))
    index = index.with_columns(
        pl.when(pl.col("utt_id") == "rec000_0000")
        .then(pl.lit("../escape.flac"))
        .otherwise(pl.col("audio_path"))
        .alias("audio_path")
    )
    data_root.write_parquet(layout.utterance_index("asr-0001"), index.to_arrow())
    summary = run_asr_flac(data_root, "asr-0001")
    assert [(r.utt_id, r.reason) for r in summary.rejects] == [("rec000_0000", "tar_member_unsafe_path")]
    assert not list(tmp_path.rglob("escape*"))
    assert not data_root.glob(f"{layout.asr_flac_dir('asr-0001')}/rec000_0000-*.flac")


def test_manifest_build_on_a_sample_shard(imported_shard):
    data_root = imported_shard
    run_raw_shards(data_root, "asr-0001")
    run_asr_flac(data_root, "asr-0001")
    data_root.write_parquet(
        layout.asr_language_corrections(), pl.DataFrame({"recording_id": ["rec001"], "language": ["mr"]}).to_arrow()
    )
    summary = build_and_write_asr_manifests(
        data_root, AsrManifestConfig(validation_share=0.5, min_quality=0.5), combined=True
    )
    build = summary.build
    assert summary.shards == 1 and summary.input_rows == 12
    assert build.train.height + build.validation.height + build.removed.height == 12
    # The source's own columns ride in the index's ``extra`` namespace.
    index = data_root.read_parquet(layout.utterance_index("asr-0001"))
    quality = pl.from_arrow(unpack_extras(index, [pa.field("tx_quality_score", pa.float64())]))
    assert build.removed_by_reason["quality_below_minimum"] == quality["tx_quality_score"].lt(0.5).sum()
    every = pl.concat([build.train, build.validation])
    assert every.filter(pl.col("recording_id") == "rec001")["lang"].unique().to_list() in ([], ["mr"])
    hindi = every.filter(pl.col("original_language") == "hi")["text"].to_list()
    assert all(t == "<|hi|> नमस्ते आप कैसे हैं" for t in hindi if not t.startswith("<|mr|>"))
    assert build.recordings_in_both_splits() == 0
    written = pl.read_ndjson(data_root.path(layout.asr_manifest("train", "jsonl")))
    assert written.columns == ["audio_filepath", "duration", "text", "lang"] and written.height == build.train.height
    # Relative to the manifest's directory (NeMo's rule), so the root can move.
    manifests_dir = os.path.dirname(data_root.path(layout.asr_manifest("train", "jsonl")))
    assert not any(os.path.isabs(p) for p in written["audio_filepath"])
    assert all(sf.info(os.path.join(manifests_dir, p)).samplerate == 16_000 for p in written["audio_filepath"])
