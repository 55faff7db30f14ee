"""raw_shards' contract: shard-level errors name file, column and rule; bad rows become rejects."""

import json

import pyarrow as pa
import pytest

from speechdata.io import layout
from speechdata.landing.contract import ContractError
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.landing.raw_shard import validate_landed_shard
from tests.conftest import encode, land_shard, tone


def good_row(utt_id: str, path: str | None = None, **overrides) -> dict:
    row = {
        "utt_id": utt_id,
        "audio_path": path or f"{utt_id}.wav",
        "text": "hello world",
        "language": "en",
        "country": "us",
        "start_s": None,
        "end_s": None,
        "source": "test",
    }
    row.update(overrides)
    return row


def wav(seconds=1.0, rate=16_000, channels=1) -> bytes:
    return encode(tone(seconds, rate, channels=channels), rate)


def reasons(validation) -> dict[str, str]:
    return {r.utt_id: r.reason for r in validation.rejects}


def test_missing_required_column_fails_naming_file_column_and_rule(data_root):
    table = pa.table({"utt_id": ["a"], "text": ["x"]})
    land_shard(data_root, "s1", [], {}, table=table)
    with pytest.raises(ContractError) as err:
        validate_landed_shard(data_root, "s1")
    assert err.value.column == "audio_path"
    assert "metadata.parquet" in err.value.file
    assert "required column is missing" in str(err.value)


def test_wrong_column_type_fails_naming_the_column(data_root):
    table = pa.table({"utt_id": ["a"], "audio_path": ["a.wav"], "start_s": ["zero"]})
    land_shard(data_root, "s1", [], {"a.wav": wav()}, table=table)
    with pytest.raises(ContractError, match=r"column 'start_s': must be of type double, found string"):
        validate_landed_shard(data_root, "s1")


def test_integer_utt_id_is_a_type_error(data_root):
    table = pa.table({"utt_id": [1], "audio_path": ["a.wav"]})
    land_shard(data_root, "s1", [], {"a.wav": wav()}, table=table)
    with pytest.raises(ContractError, match="column 'utt_id'"):
        validate_landed_shard(data_root, "s1")


def test_missing_metadata_file_fails(data_root):
    data_root.write_bytes(layout.landing_success_marker("s1"), b"")
    with pytest.raises(ContractError, match="metadata.parquet: file is missing"):
        validate_landed_shard(data_root, "s1")


def test_corrupt_metadata_file_fails(data_root):
    data_root.write_bytes(layout.landing_metadata("s1"), b"PAR1 this is not parquet")
    with pytest.raises(ContractError, match="not a readable parquet file"):
        validate_landed_shard(data_root, "s1")


def test_invalid_shard_id_fails():
    from speechdata.io.storage import DataRoot

    with pytest.raises(ContractError, match="shard id"):
        validate_landed_shard(DataRoot("/nonexistent"), "Bad.Shard")


def test_optional_columns_may_be_absent_and_extras_are_carried(data_root):
    table = pa.table({"utt_id": ["a"], "audio_path": ["a.wav"], "speaker": ["spk1"]})
    land_shard(data_root, "s1", [], {"a.wav": wav()}, table=table)
    index = validate_landed_shard(data_root, "s1").index
    assert index["text"].to_pylist() == [None]
    assert [json.loads(e) for e in index["extra"].to_pylist()] == [{"speaker": "spk1"}]
    assert "speaker" not in index.column_names


def test_bad_rows_are_rejected_and_good_rows_of_the_same_shard_survive(data_root):
    rows = [
        good_row("ok1"),
        good_row("dup"),
        good_row("dup", path="ok1.wav"),
        good_row("has.dot", path="ok1.wav"),
        good_row("bad id!", path="ok1.wav"),
        good_row("missing", path="nowhere.wav"),
        good_row("corrupt"),
        good_row("empty"),
        good_row("reversed", path="ok1.wav", start_s=0.5, end_s=0.5),
        good_row("past_end", path="ok1.wav", start_s=0.2, end_s=1.5),
        good_row("starts_after_end", path="ok1.wav", start_s=2.0),
        good_row("escape", path="../outside.wav"),
        good_row("absolute", path="/etc/passwd"),
        good_row("bad_lang", path="ok1.wav", language="english"),
        good_row("segment", path="ok1.wav", start_s=0.25, end_s=0.75),
    ]
    files = {
        "ok1.wav": wav(1.0),
        "corrupt.wav": b"RIFF\x00\x00\x00\x00WAVEgarbage",
        "empty.wav": encode(tone(0.0, 16_000), 16_000),
    }
    land_shard(data_root, "s1", rows, files)
    validation = validate_landed_shard(data_root, "s1")
    assert sorted(validation.index["utt_id"].to_pylist()) == ["ok1", "segment"]
    got = [(r.utt_id, r.reason) for r in validation.rejects]
    assert sorted(got) == sorted(
        [
            ("dup", "duplicate_utt_id"),
            ("dup", "duplicate_utt_id"),
            ("has.dot", "utt_id_has_dot"),
            ("bad id!", "invalid_utt_id"),
            ("missing", "audio_not_found"),
            ("corrupt", "audio_unreadable"),
            ("empty", "audio_empty"),
            ("reversed", "segment_start_not_before_end"),
            ("past_end", "segment_past_end_of_file"),
            ("starts_after_end", "segment_past_end_of_file"),
            ("escape", "unsafe_audio_path"),
            ("absolute", "unsafe_audio_path"),
            ("bad_lang", "invalid_language"),
        ]
    )
    assert all(r.stage == "raw_shards" and "metadata row" in r.detail for r in validation.rejects)
    assert validation.landed_rows == len(rows) == validation.index.num_rows + len(validation.rejects)
    segment = validation.index.filter(pa.compute.equal(validation.index["utt_id"], "segment")).to_pylist()[0]
    assert segment["segment_start_s"] == 0.25 and segment["segment_end_s"] == 0.75
    assert segment["duration_s"] == pytest.approx(0.5)


def test_segment_end_within_tolerance_is_clamped_to_the_file(data_root):
    land_shard(data_root, "s1", [good_row("a", start_s=0.0, end_s=1.003)], {"a.wav": wav(1.0)})
    index = validate_landed_shard(data_root, "s1").index
    assert index["segment_end_s"].to_pylist() == [1.0]


@pytest.mark.parametrize("as_tar", [False, True])
@pytest.mark.parametrize("rate", [8_000, 16_000, 44_100, 48_000])
def test_any_rate_and_stereo_become_24k_mono_of_the_right_length(data_root, rate, as_tar):
    rows = [good_row("mono"), good_row("stereo")]
    files = {
        "mono.wav": encode(tone(1.3, rate, freq=440), rate),
        "stereo.wav": encode(tone(1.3, rate, freq=440, channels=2), rate, "FLAC"),
    }
    land_shard(data_root, "s1", rows, files, as_tar=as_tar)
    summary = run_raw_shards(data_root, "s1")
    index = summary.index
    assert summary.rows_out == 2 and not summary.rejects
    assert index["source_sample_rate"].to_pylist() == [rate, rate]
    assert sorted(index["source_channels"].to_pylist()) == [1, 2]

    normalized = run_normalized_audio(data_root, "s1")
    assert normalized.rows_out == 2 and not normalized.rejects
    from speechdata.audio.container import iter_container_audio

    for utt_id, samples, out_rate in iter_container_audio(data_root, layout.normalized_audio("s1")):
        assert out_rate == 24_000 and samples.ndim == 1
        assert samples.shape[0] == -(-round(1.3 * rate) * 24_000 // rate)
        spectrum = abs(__import__("numpy").fft.rfft(samples))
        peak_hz = spectrum.argmax() * 24_000 / samples.shape[0]
        assert abs(peak_hz - 440) < 2, (utt_id, peak_hz)


def test_country_must_be_a_lowercase_iso_alpha2_code_and_a_country_name_is_rejected_with_its_code(data_root):
    rows = [
        good_row("code", country="fr"),
        good_row("name", path="code.wav", country="france"),
        good_row("upper", path="code.wav", country="DE"),
        good_row("spaced_name", path="code.wav", country="United Kingdom"),
        good_row("unknown", path="code.wav", country="xx"),
        good_row("partition_like", path="code.wav", country="germany-east"),
        good_row("no_country", path="code.wav", country=None),
    ]
    land_shard(data_root, "s1", rows, {"code.wav": wav(1.0)})
    validation = validate_landed_shard(data_root, "s1")
    assert sorted(validation.index["utt_id"].to_pylist()) == ["code", "no_country"]
    details = {r.utt_id: r.detail for r in validation.rejects if r.reason == "invalid_country"}
    assert sorted(details) == ["name", "partition_like", "spaced_name", "unknown", "upper"]
    metadata_file = layout.landing_metadata("s1")  # relative to the root: the same ledger under any root
    for utt_id, detail in details.items():
        assert f"{metadata_file}, field 'country': " in detail, detail
    assert "'france' is not a lowercase ISO 3166-1 alpha-2 country code: use 'fr'" in details["name"]
    assert details["upper"].endswith("use 'de'")
    assert details["spaced_name"].endswith("use 'gb'")
    assert "'xx' is not a lowercase ISO 3166-1 alpha-2 country code" in details["unknown"]
    assert "use '" not in details["unknown"]


def test_only_country_codes_become_country_partitions(data_root):
    from speechdata.landing.contract import partition_values

    land_shard(
        data_root,
        "s1",
        [good_row("a", country="fr"), good_row("b", country="france"), good_row("c", country="at")],
        {},
    )
    with data_root.fs.open(data_root.path(layout.landing_metadata("s1")), "rb") as handle:
        countries, languages = partition_values(handle, "metadata.parquet")
    assert (countries, languages) == (["at", "fr"], ["en"])
