"""Per-country aligned-JSON import: aligned JSONs over long recordings become landing shards, nothing lost."""

import json

import pytest

from speechdata.importers.aligned_json import import_aligned_countries
from speechdata.importers.country_languages import UnknownCountryError, language_for_country
from speechdata.io import layout
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.aligned_json import build_aligned_json_corpus


@pytest.fixture
def corpus(tmp_path, clips):
    countries = tmp_path / "countries"
    build_aligned_json_corpus(countries, {"germany": 2, "france": 1}, clips=clips, audio_format="flac")
    return countries


def test_every_segment_lands_as_a_row_with_the_seed_fields_under_the_country_code(corpus, data_root):
    reports = {r.country: r for r in import_aligned_countries(str(corpus), data_root)}
    assert reports["de"].recordings == 2 and reports["fr"].recordings == 1
    assert (reports["de"].folder, reports["fr"].folder) == ("germany", "france")
    [shard] = reports["de"].shards
    assert shard.startswith("de-")
    rows = {r["utt_id"]: r for r in data_root.read_parquet(layout.landing_metadata(shard)).to_pylist()}
    for json_path in sorted((corpus / "germany/Alignment/alignment_output").glob("*_aligned.json")):
        video_id, transcript_id = json_path.name[: -len("_aligned.json")].rsplit("_", 1)
        for seg in json.loads(json_path.read_text())["segments"]:
            key = f"de_{video_id}_{round(seg['start'] * 1000)}_{round(seg['end'] * 1000)}"
            row = rows.pop(key)
            assert (row["start_s"], row["end_s"]) == pytest.approx((seg["start"], seg["end"]), abs=5e-4)
            assert (row["human_text"], row["asr_text"], row["text"]) == (
                seg["human_text"],
                seg["asr_text"],
                seg["human_text"],
            )
            assert (row["cer"], row["transcript_start_idx"], row["transcript_end_idx"]) == (
                seg["cer"],
                seg["start_idx"],
                seg["end_idx"],
            )
            assert (row["language"], row["country"], row["video_id"], row["transcript_id"]) == (
                "de",
                "de",
                video_id,
                transcript_id,
            )
    assert rows == {}
    assert data_root.exists(layout.landing_success_marker(shard))
    summary = run_raw_shards(data_root, shard)
    assert summary.rejects == [] and summary.rows_out == summary.rows_in


def test_a_second_import_lands_only_new_recordings(corpus, data_root, clips):
    [first] = import_aligned_countries(str(corpus), data_root, ["germany"])
    [again] = import_aligned_countries(str(corpus), data_root, ["germany"])
    assert again.shards == [] and again.already_landed == 2
    build_aligned_json_corpus(corpus, {"germany": 1}, clips=clips, audio_format="flac", first_recording=10)
    [more] = import_aligned_countries(str(corpus), data_root, ["germany"])
    assert more.recordings == 1 and more.already_landed == 2 and set(more.shards).isdisjoint(first.shards)


def test_unknown_country_is_an_error_that_lists_the_map(corpus, data_root):
    (corpus / "atlantis").mkdir()
    with pytest.raises(UnknownCountryError, match=r"'atlantis' is neither an ISO 3166-1 alpha-2 code.*de=de"):
        import_aligned_countries(str(corpus), data_root)
    assert not data_root.exists(layout.LANDING)  # nothing landed before the error
    assert language_for_country("germany", {"germany": "el"}) == "el"
    assert language_for_country("Austria") == language_for_country("at") == "de"
    with pytest.raises(UnknownCountryError, match=r"'is' \('is'\) has no language"):
        language_for_country("is")


def test_a_missing_country_folder_is_an_error_naming_it_and_nothing_lands(corpus, data_root, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no country folder 'spain'"):
        import_aligned_countries(str(corpus), data_root, ["germany", "spain"])
    with pytest.raises(FileNotFoundError, match=r"no country folder 'germany'"):
        import_aligned_countries(str(tmp_path / "no-such-dir"), data_root, ["germany"])
    assert not data_root.exists(layout.LANDING)


def test_malformed_json_is_reported_with_its_file_and_the_rest_lands(corpus, data_root):
    broken = corpus / "france/Alignment/alignment_output/broken_t9_aligned.json"
    broken.write_text('{"audio_file": "audio/x.flac", "segments": [{"start": 1.0}]}')
    [report] = import_aligned_countries(str(corpus), data_root, ["france"])
    assert list(report.rejected_files) == [str(broken)]
    assert "missing key 'end'" in report.rejected_files[str(broken)]
    assert report.recordings == 1


def test_missing_recording_and_segment_past_the_end_become_recorded_rejects(corpus, data_root):
    json_dir = corpus / "france/Alignment/alignment_output"
    [good] = sorted(json_dir.glob("*_aligned.json"))
    document = json.loads(good.read_text())
    document["segments"].append({**document["segments"][0], "start": 500.0, "end": 505.0})
    good.write_text(json.dumps(document))
    (json_dir / "gone_t1_aligned.json").write_text(
        json.dumps({"audio_file": "audio/gone.opus", "segments": document["segments"][:1]})
    )
    [report] = import_aligned_countries(str(corpus), data_root, ["france"])
    assert report.missing_recordings == [f"{corpus}/france/audio/gone.opus"]
    [shard] = report.shards
    summary = run_raw_shards(data_root, shard)
    assert summary.rejects_by_reason == {"audio_not_found": 1, "segment_past_end_of_file": 1}
    assert summary.rows_out + len(summary.rejects) == summary.rows_in
