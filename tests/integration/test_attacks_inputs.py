"""Attacks through what a user lands or types: tar members that lie about their size, JSON nested
100 000 deep, null ids, out-of-range numbers, NaN on the command line.

Each is refused at its one chokepoint (``speechdata.io.safe_tar``, ``speechdata.io.bounded_json``,
the importers' and the HF dataset's range checks, ``speechdata.command_options``) with a recorded
reject or a clear error naming the file, member or field, never by failing a whole step.
"""

import argparse
import io
import json
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from speechdata.alignment.table import alignment_rows, alignments_table
from speechdata.audio.codec import TARGET_SAMPLE_RATE
from speechdata.audio.container import AUDIO_CONTAINER_SCHEMA, AudioContainerWriter, EncodedUtterance
from speechdata.command_options import finite_float
from speechdata.hf.segments import SEGMENT_SCHEMA, SegmentLimits, filter_reasons
from speechdata.importers.aligned_json import import_aligned_countries
from speechdata.importers.granary import import_granary_parquet
from speechdata.importers.language_tars import import_language_tar
from speechdata.io import layout
from speechdata.io.bounded_json import JsonBoundsError, json_depth, load_bounded_json
from speechdata.io.safe_tar import audit_tar
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.aligned_json import build_aligned_json_corpus
from speechdata.translation.segmentation_input import SegmentationError, read_segmentation
from speechdata.translation.stage import run_streaming_segments
from tests.conftest import encode, land_shard, tone

FOUR_GB = 4 << 30


def sparse_tar(members: list[tuple[str, bytes]], sparse_name: str, stored: bytes, claimed: int) -> bytes:
    """A PAX tar with ordinary members and one GNU sparse (1.0) member: ``stored`` bytes in the
    archive that read back as ``claimed`` bytes (the rest a hole of zeros)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        sparse_map = f"1\n0\n{len(stored)}\n".encode().ljust(512, b"\0")
        info = tarfile.TarInfo(f"GNUSparseFile.0/{sparse_name}")
        info.size = len(sparse_map) + len(stored)
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": sparse_name,
            "GNU.sparse.realsize": str(claimed),
        }
        tar.addfile(info, io.BytesIO(sparse_map + stored))
    return buffer.getvalue()


def rejects_of(data_root, shard_id, stage):
    table = data_root.read_parquet(layout.rejects(shard_id, stage))
    return {r["utt_id"]: (r["reason"], r["detail"]) for r in table.to_pylist()}


def test_a_sparse_tar_member_claiming_4_gb_is_rejected_by_name_and_size_before_it_is_read(data_root):
    wav = encode(tone(1.0, 16_000), 16_000)
    archive = sparse_tar([("ok.wav", wav)], "big.wav", wav[:2048], FOUR_GB)
    assert len(archive) < 64 << 10  # a few kilobytes that read back as 4 GB
    data_root.write_bytes(layout.landing_audio_tar("sparse"), archive)
    land_shard(
        data_root,
        "sparse",
        [{"utt_id": "ok", "audio_path": "ok.wav"}, {"utt_id": "big", "audio_path": "big.wav"}],
        {},
    )
    index = run_raw_shards(data_root, "sparse").index
    reason, detail = rejects_of(data_root, "sparse", "raw_shards")["big"]
    assert reason == "tar_member_sparse"
    assert "'big.wav'" in detail and f"{FOUR_GB} bytes when read, 2048 stored" in detail
    assert index["utt_id"].to_pylist() == ["ok"]


def test_a_member_claiming_more_than_the_archive_holds_or_the_limit_is_refused_from_its_header():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("a.wav")
        info.size = 1000
        tar.addfile(info, io.BytesIO(b"x" * 1000))
    whole = buffer.getvalue()
    # The member's header claims 4 GB (octal size field), its data is the original 1000 bytes.
    header = bytearray(whole[:512])
    header[124:136] = f"{FOUR_GB:011o}\0".encode()
    header[148:156] = b" " * 8
    header[148:155] = f"{sum(header):06o}\0".encode()
    lying = bytes(header) + whole[512:]
    with tarfile.open(fileobj=io.BytesIO(lying), mode="r:") as tar:
        audit = audit_tar(tar)
    assert not audit.files
    problem = audit.unsafe["a.wav"]
    assert problem.reason in ("tar_member_truncated", "tar_member_too_large") and str(FOUR_GB) in problem.detail


def test_the_language_tars_importer_refuses_a_sparse_member_and_leaves_no_temp_behind(tmp_path, data_root):
    wav = encode(tone(1.0, 16_000), 16_000)
    source = tmp_path / "000003.tar"
    source.write_bytes(sparse_tar([("a.wav", wav)], "huge.wav", wav[:1024], 64 << 20))
    # What an import killed mid-copy leaves: a temp of the shard's audio.tar.
    data_root.fs.makedirs(data_root.path(layout.landing_dir("lid-000003")), exist_ok=True)
    stale = data_root.path(f"{layout.landing_dir('lid-000003')}/._tmp-0123456789ab-audio.tar")
    data_root.fs.pipe(stale, b"half a tar")

    shard = import_language_tar(data_root, str(source), {})

    assert shard.files == 1
    [refused] = shard.refused_members
    assert refused.name == "huge.wav" and refused.reason == "tar_member_sparse"
    assert f"{64 << 20} bytes when read, 1024 stored" in refused.detail
    with tarfile.open(data_root.path(layout.landing_audio_tar("lid-000003"))) as tar:
        assert [m.size for m in tar.getmembers()] == [len(wav)]
    assert not data_root.fs.exists(stale)
    assert not [p for p in data_root.fs.find(data_root.root) if "._tmp-" in p]


def test_json_nested_100000_deep_is_one_reject_of_the_streaming_segments_step(data_root):
    shard = "deep"
    words = {"good": ["hello", "world"], "deep": ["hello", "world"]}
    rows = [r for utt, ws in words.items() for r in alignment_rows(utt, "word", _timed(ws))]
    data_root.write_parquet(layout.alignments(shard), alignments_table(rows))
    data_root.write_parquet(
        layout.alignment_scores(shard), pa.table({"utt_id": list(words), "score": pa.array([-1.0, -1.0], pa.float32())})
    )
    data_root.write_parquet(
        layout.utterance_index(shard), pa.table({"utt_id": list(words), "text": ["hello world"] * 2})
    )
    with data_root.parquet_writer(layout.normalized_audio(shard), AUDIO_CONTAINER_SCHEMA) as writer:
        container = AudioContainerWriter(writer)
        for utt_id in words:
            samples = np.zeros(TARGET_SAMPLE_RATE, "<i2")
            container.add(EncodedUtterance(utt_id, TARGET_SAMPLE_RATE, TARGET_SAMPLE_RATE, "pcm16", samples))
        container.flush()
    level = {"English": ["hello world"], "Chinese": ["你好世界"]}
    good = {"low_latency": level, "medium_latency": level, "high_latency": level}
    seg_dir = layout.landing_segmentation_dir(shard)
    data_root.write_bytes(f"{seg_dir}/good.json", json.dumps(good, ensure_ascii=False).encode())
    data_root.write_bytes(f"{seg_dir}/deep.json", b"[" * 100_000 + b"]" * 100_000)

    summary = run_streaming_segments(data_root, shard)

    reason, detail = rejects_of(data_root, shard, "streaming_segments")["deep"]
    assert reason == "segmentation_over_json_limits"
    assert "deep.json" in detail and "nested 100000 levels deep, deeper than the parser goes" in detail
    assert summary.rows_out == 1 and summary.rows_in == 2


def _timed(words):
    from speechdata.alignment.table import TimedUnit

    return [TimedUnit(w, 500 * i, 500 * i + 400, -0.1) for i, w in enumerate(words)]


def test_the_json_chokepoint_bounds_depth_and_size_and_counts_no_bracket_inside_a_string():
    assert json_depth(b'{"a": "[[[[[[\\"[[", "b": [[1]]}') == 3
    assert load_bounded_json('{"a": "[[[[[["}', "x.json") == {"a": "[[[[[["}
    with pytest.raises(JsonBoundsError, match="x.json: JSON nested 50000 levels deep"):
        load_bounded_json("[" * 50_000 + "]" * 50_000, "x.json")
    with pytest.raises(JsonBoundsError, match="x.json: JSON of 12 bytes is over the 10-byte limit"):
        load_bounded_json('"0123456789"', "x.json", max_bytes=10)
    with pytest.raises(SegmentationError) as raised:
        read_segmentation(b"[" * 50_000, "s.json")
    assert raised.value.reason == "segmentation_over_json_limits"


def test_a_granary_row_with_a_null_id_lands_null_and_is_rejected_missing_utt_id(tmp_path, data_root):
    wav = encode(tone(1.0, 16_000), 16_000)
    source = tmp_path / "granary.parquet"
    pq.write_table(
        pa.table(
            {
                "id": ["a", None, ""],
                "audio": [{"bytes": wav, "path": "a.wav"}] * 3,
                "text": ["one", "two", "three"],
            }
        ),
        source,
    )
    landed = import_granary_parquet(data_root, "gran", str(source), id_column="id", language="en")
    assert landed.metadata["utt_id"].to_pylist() == ["a", None, None]  # never the text "None"
    with tarfile.open(data_root.path(layout.landing_audio_tar("gran"))) as tar:
        assert tar.getnames() == ["a.wav"]
    summary = run_raw_shards(data_root, "gran")
    assert summary.index["utt_id"].to_pylist() == ["a"]
    reasons = [r.reason for r in summary.rejects]
    assert reasons == ["missing_utt_id", "missing_utt_id"]


def _aligned_segment(**overrides):
    segment = {
        "start": 1.0,
        "end": 5.0,
        "asr_text": "hello there",
        "human_text": "hello there",
        "cer": 0.1,
        "start_idx": 0,
        "end_idx": 11,
    }
    return {**segment, **overrides}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"cer": -0.5}, "'cer' -0.5 is not a finite rate >= 0"),
        ({"start_idx": 50, "end_idx": 10}, "'start_idx' 50 is after 'end_idx' 10"),
        ({"start_idx": -3}, "'start_idx' -3 is negative"),
    ],
)
def test_the_aligned_json_importer_refuses_out_of_range_numbers_naming_the_field(tmp_path, data_root, bad, message):
    [json_path] = build_aligned_json_corpus(tmp_path / "corpus", {"fr": 1}, segments_per_recording=2)
    document = json.loads(json_path.read_text())
    document["segments"][1].update(bad)
    json_path.write_text(json.dumps(document))

    [report] = import_aligned_countries(str(tmp_path / "corpus"), data_root)

    assert report.segments == 0
    [(path, error)] = report.rejected_files.items()
    assert path.endswith(json_path.name) and f"segments[1]: {message}" in error


def test_the_hf_boundary_never_keeps_a_negative_cer_swapped_indexes_or_a_nan_duration():
    rows = [
        {"cer": 0.1, "transcript_start_idx": 0, "transcript_end_idx": 10, "duration_s": 5.0},
        {"cer": -0.5, "transcript_start_idx": 0, "transcript_end_idx": 10, "duration_s": 5.0},
        {"cer": 0.1, "transcript_start_idx": 50, "transcript_end_idx": 10, "duration_s": 5.0},
        {"cer": float("nan"), "transcript_start_idx": 0, "transcript_end_idx": 10, "duration_s": 5.0},
        {"cer": 0.1, "transcript_start_idx": 0, "transcript_end_idx": 10, "duration_s": float("nan")},
    ]
    filled = {
        "key": "k",
        "shard_id": "s",
        "language": "fr",
        "human_text": "a",
        "asr_text": "a",
        "transcript_id": "t",
    }
    table = pa.Table.from_pylist(
        [{**filled, "key": f"k{i}", **row} for i, row in enumerate(rows)], schema=SEGMENT_SCHEMA
    )
    for limit in ("min_duration_s", "max_duration_s", "max_cer"):  # a NaN limit would keep everything
        with pytest.raises(ValueError, match=f"segment limit {limit}=nan must be a finite number >= 0"):
            SegmentLimits(**{limit: float("nan")})
    assert filter_reasons(table, SegmentLimits()) == [
        None,
        "cer_out_of_range",
        "transcript_indexes_out_of_range",
        "cer_out_of_range",
        "duration_out_of_range",
    ]


def _every_parser(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _every_parser(child, (*path, name))


def test_no_command_line_option_takes_a_bare_float_or_int_and_nan_or_inf_exits_2(capsys):
    """Structural: every numeric option of every ``speechdata`` command, present and future, is typed
    by ``speechdata.command_options`` (a bare ``float`` lets ``nan`` through: a NaN limit filters nothing)."""
    from speechdata.cli import build_parser, run

    numeric = []
    for path, parser in _every_parser(build_parser()):
        for action in parser._actions:
            assert action.type not in (float, int), (
                f"speechdata {' '.join(path)} {action.option_strings}: bare {action.type.__name__}"
            )
            if action.type is finite_float:
                numeric.append((path, action.option_strings[0]))
    assert (("catalog",), "--max-duration") in numeric and len(numeric) >= 8
    for path, option in numeric:
        for value in ("nan", "inf", "-inf"):
            with pytest.raises(SystemExit) as exited:
                run([*path, f"{option}={value}", *(["--out", "/nonexistent"] if path[0] == "export" else [])])
            assert exited.value.code == 2, (path, option, value)
            assert f"must be finite, got '{value}'" in capsys.readouterr().err
