"""The metadata helpers the Dagster UI shows: column descriptions, histograms, rejects samples."""

import pyarrow as pa
import pytest

from assets.reporting import COLUMN_DESCRIPTIONS, column_schema, markdown_histogram
from speechdata.alignment.table import ALIGNMENTS_SCHEMA, UTTERANCE_SCORES_SCHEMA
from speechdata.asr.flac import ASR_FLAC_INDEX_SCHEMA
from speechdata.asr.manifest import MANIFEST_COLUMNS as ASR_MANIFEST_COLUMNS
from speechdata.bridge.grid_stage import FRAME_GRIDS_SCHEMA
from speechdata.bridge.manifest import MANIFEST_COLUMNS
from speechdata.bridge.tars import BRIDGE_INDEX_SCHEMA
from speechdata.landing.contract import CONTRACT_COLUMNS
from speechdata.landing.raw_shard import PROBE_FIELDS
from speechdata.translation.qe_stage import SCORED_SCHEMA
from speechdata.translation.stage import SEGMENTS_SCHEMA
from speechdata.vad.language_index import LANGUAGE_INDEX_SCHEMA
from speechdata.vad.stage import VAD_SEGMENTS_SCHEMA

STORED_TABLES = {
    "utterances.parquet": [*CONTRACT_COLUMNS, "extra", *(f.name for f in PROBE_FIELDS)],
    "shard_manifest": MANIFEST_COLUMNS.names,
    "bridge_index": BRIDGE_INDEX_SCHEMA.names,
    "alignments": ALIGNMENTS_SCHEMA.names,
    "alignment_scores": UTTERANCE_SCORES_SCHEMA.names,
    "frame_grids": FRAME_GRIDS_SCHEMA.names,
    "vad_segments": VAD_SEGMENTS_SCHEMA.names,
    "language_shard_index": LANGUAGE_INDEX_SCHEMA.names,
    "streaming_segments": SEGMENTS_SCHEMA.names,
    "qe_scores": SCORED_SCHEMA.names,
    "asr_flac": ASR_FLAC_INDEX_SCHEMA.names,
    "asr_manifest": [*ASR_MANIFEST_COLUMNS, "split"],
}


@pytest.mark.parametrize("table", sorted(STORED_TABLES))
def test_every_stored_tables_columns_have_a_description(table):
    assert [c for c in STORED_TABLES[table] if not COLUMN_DESCRIPTIONS.get(c)] == []


def test_column_schema_describes_columns_and_an_asset_may_say_more():
    schema = pa.schema([pa.field("utt_id", pa.string()), pa.field("own", pa.int32())])
    columns = column_schema(schema, {"own": "The asset's own column."}).columns
    assert [(c.name, c.type, c.description) for c in columns] == [
        ("utt_id", "string", COLUMN_DESCRIPTIONS["utt_id"]),
        ("own", "int32", "The asset's own column."),
    ]


def test_histogram_counts_every_value_once_and_nulls_apart():
    values = [0.0, 0.5, 1.0, 1.0, 9.99, 10.0, None, float("nan")]
    text = markdown_histogram(values, "duration_s", bins=4).value
    rows = text.split("\n\n")[0].splitlines()[2:]
    counts = [int(row.split("|")[2]) for row in rows]
    assert counts == [4, 0, 0, 2] and "2 null" in text
    assert markdown_histogram([None], "duration_s").value == "_no values_ (1 null)"
    # One distinct value: every count in one bin, no division by zero.
    assert "| 3 |" in markdown_histogram([2.0, 2.0, 2.0], "duration_s").value


def test_a_failed_check_says_why_in_its_description_and_a_passed_one_says_nothing():
    from assets.reporting import accounting_check, utterance_check_results
    from speechdata.accounting.rejects import Reject
    from speechdata.accounting.stage import StageSummary

    lost_one = StageSummary(
        "s1", rows_in=5, rows_out=3, rejects=[Reject("u1", "x", "bad")], audio_seconds=1.0, compute_seconds=1.0
    )
    [failed] = accounting_check("accounted", lost_one, "landed", "indexed")
    assert not failed.passed
    assert failed.description == "Shard 's1': 5 landed but 3 indexed + 1 rejected; 1 unaccounted for"
    balanced = StageSummary(
        "s1", rows_in=4, rows_out=3, rejects=[Reject("u1", "x", "bad")], audio_seconds=1.0, compute_seconds=1.0
    )
    [passed] = accounting_check("accounted", balanced, "landed", "indexed")
    assert passed.passed and passed.description is None

    failing, clean = utterance_check_results({"grid_covers_audio": ["u7", "u9"], "tokens_match": []})
    assert not failing.passed and failing.description == "2 utterances fail grid_covers_audio, e.g. u7, u9"
    assert clean.passed and clean.description is None
