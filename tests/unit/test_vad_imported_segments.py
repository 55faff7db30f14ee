"""Speech segments landed beside a shard (``landing/<shard>/vad_segments.parquet``) as the VAD stage reads them."""

import pyarrow as pa
import pytest

from speechdata.importers.language_tars import IMPORTED_SEGMENTS_SCHEMA
from speechdata.io import layout
from speechdata.vad.stage import read_imported_segments

SHARD = "shard-a"


def land_segments(data_root, rows: list[dict]) -> None:
    data_root.write_parquet(
        layout.landing_vad_segments(SHARD), pa.Table.from_pylist(rows, schema=IMPORTED_SEGMENTS_SCHEMA)
    )


def test_landed_segments_are_sorted_clamped_to_the_file_and_empty_ones_counted(data_root):
    land_segments(data_root, [{"audio_path": "a.wav", "start_s": [2.0, 0.5, 3.0, -1.0], "end_s": [2.5, 1.0, 3.0, 0.2]}])
    imported, dropped = read_imported_segments(data_root, SHARD, {"a.wav": 2.4})
    assert imported["a.wav"].start_s == (0.0, 0.5, 2.0)
    assert imported["a.wav"].end_s == (0.2, 1.0, 2.4)
    assert dropped == 1


def test_a_row_with_more_starts_than_ends_is_an_error_naming_the_file_and_the_audio_path(data_root):
    land_segments(data_root, [{"audio_path": "a.wav", "start_s": [0.5, 2.0], "end_s": [1.0]}])
    with pytest.raises(ValueError, match=r"vad_segments\.parquet: audio_path 'a\.wav' has 2 start_s and 1 end_s"):
        read_imported_segments(data_root, SHARD, {"a.wav": 3.0})
