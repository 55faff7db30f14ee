"""Cut segments out of landed recordings and stream them into a split's parquet files.

Rows follow the published dataset's features (:func:`hf_features`) plus ``shard_id``: a row is identified by
``(shard_id, key)``. Memory holds one landed file's encoded segments at a time, up to
:data:`ROW_GROUP_BYTES` of them (:class:`RecordingRows`): a longer recording's rows wait in an
anonymous temporary file and are written in row groups of about that size.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import soundfile as sf

from speechdata.audio.codec import downmix_to_mono, encode_flac, read_segment_from, resample
from speechdata.hf.files import SplitFiles, SplitSink
from speechdata.hf.filters import word_error_rate
from speechdata.landing.landed_audio import AudioNotFound, LandedAudio

if TYPE_CHECKING:
    import datasets


def hf_features(sample_rate: int) -> datasets.Features:
    """The published dataset's schema, with the sampling rate found in the data."""
    # Imported here: `datasets` costs ~3 s, and every Dagster step process imports this module.
    import datasets

    v = datasets.Value
    return datasets.Features(
        {
            "audio": datasets.Audio(sampling_rate=sample_rate),
            "key": v("string"),
            "shard_id": v("string"),
            "country": v("string"),
            "language": v("string"),
            "video_id": v("string"),
            "transcript_id": v("string"),
            "start_seconds": v("float32"),
            "end_seconds": v("float32"),
            "duration_seconds": v("float32"),
            "asr_transcript": v("string"),
            "human_transcript": v("string"),
            "cer": v("float32"),
            "wer": v("float32"),
            "original_transcript_start_idx": v("int32"),
            "original_transcript_end_idx": v("int32"),
            # Appended last: a reader selecting the earlier columns by position keeps working.
            "text": v("string"),
            "text_source": v("string"),
            "asr_confidence": v("float32"),
        }
    )


ROWS_PER_BATCH = 16
"""Rows turned into Arrow at once while a recording is cut (a long recording has hundreds)."""

ROW_GROUP_BYTES = 16_000_000
"""Encoded payload of one recording's rows held in memory, and of one row group of a longer recording.

A recording within it is written as one row group, as it always was (the same file bytes); 2 hours
of 16 kHz FLAC are 148 MB, and holding them made a build's memory grow with the recording."""


class RecordingRows:
    """One recording's encoded rows as they are cut, :data:`ROWS_PER_BATCH` at a time: held in memory
    up to :data:`ROW_GROUP_BYTES` of payload, past that moved to an anonymous temporary file (Arrow
    IPC; gone with the process, whatever kills it). Iterating gives the tables to write, one row
    group each: the held rows as one table, or the file's read back in groups of about that payload."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.payload = 0
        self.most_held = 0
        """The most payload held in memory at once."""
        self._held: list[tuple[pa.Table, int]] = []
        self._spill = None
        self._spilled: list[tuple[int, int]] = []
        """``(record batches, payload)`` of each table in the file, in order."""

    def add(self, table: pa.Table, payload: int) -> None:
        self.payload += payload
        if self._spill is None:
            self._held.append((table, payload))
            held = sum(p for _, p in self._held)
            self.most_held = max(self.most_held, held)
            if held <= ROW_GROUP_BYTES:
                return
            # Closed once read back (or with this object): it outlives the block that opens it.
            handle = tempfile.TemporaryFile()  # noqa: SIM115
            self._spill = (handle, pa.ipc.new_stream(handle, self.schema))
            held, self._held = self._held, []
            for spilled, spilled_payload in held:
                self._write_spill(spilled, spilled_payload)
        else:
            self.most_held = max(self.most_held, payload)
            self._write_spill(table, payload)

    def _write_spill(self, table: pa.Table, payload: int) -> None:
        batches = table.to_batches()
        for batch in batches:
            self._spill[1].write_batch(batch)
        self._spilled.append((len(batches), payload))

    def __bool__(self) -> bool:
        return bool(self._held or self._spilled)

    def __iter__(self) -> Iterator[pa.Table]:
        if self._spill is None:
            if self._held:
                yield pa.concat_tables([table for table, _ in self._held])
            return
        handle, writer = self._spill
        writer.close()
        handle.seek(0)
        try:
            reader = pa.ipc.open_stream(handle)
            group: list[pa.RecordBatch] = []
            group_payload = 0
            for count, payload in self._spilled:
                if group and group_payload + payload > ROW_GROUP_BYTES:
                    yield pa.Table.from_batches(group, self.schema)
                    group, group_payload = [], 0
                group += [reader.read_next_batch() for _ in range(count)]
                group_payload += payload
            if group:
                yield pa.Table.from_batches(group, self.schema)
        finally:
            handle.close()


class SegmentWriter:
    """Cuts segments out of landed recordings and streams them into a split's parquet files."""

    def __init__(self, data_root, options, country, sample_rate, segments, position, summary):
        self.data_root, self.options, self.country = data_root, options, country
        self.sample_rate, self.segments, self.position, self.summary = sample_rate, segments, position, summary
        self.schema = hf_features(sample_rate or 16_000).arrow_schema
        self.max_file_bytes = int(options.max_file_mb * 1e6)
        self._audio: LandedAudio | None = None

    def by_recording(self, states: list[dict], recordings: dict[str, dict]) -> list[tuple[dict, list]]:
        """The landed files to cut (with their segments' identities), in storage order: by shard, then file.

        The file is each segment's own (its shard's audio): a recording id (a ``video_id``) may
        have segments in several shards, and each is cut from the shard that landed it.
        """
        ids_by_source: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
        for s in states:
            row = self.position[s["id"]]
            source = (s["shard_id"], self.segments["audio_path"][row].as_py(), s["recording_id"])
            ids_by_source.setdefault(source, []).append(s["id"])
        return [
            ({"shard_id": shard, "audio_path": audio_path, "recording_id": recording_id}, ids)
            for (shard, audio_path, recording_id), ids in sorted(ids_by_source.items())
            if recording_id in recordings
        ]

    def write(self, split: str, shard_id: str, recordings: list[tuple[dict, list]]) -> SplitFiles:
        """Write the part of ``split`` that holds ``shard_id``'s segments: its ``recordings``, cut in order."""
        with self.sink(split, shard_id) as sink:
            for recording, keys in recordings:
                table, payload = self.cut(recording, keys)
                if table is not None:
                    sink.append(table, payload)
        return sink.result

    def cut(self, recording: dict, keys: list[tuple[str, str]]) -> tuple[RecordingRows | None, int]:
        """The recording's segments ``keys``, cut and encoded as rows, and their payload in bytes."""
        return self._recording_rows(recording, keys)

    def _recording_rows(self, recording: dict, keys: list[tuple[str, str]]) -> tuple[RecordingRows | None, int]:
        # A long recording's segments become Arrow a few at a time: the rows as Python objects are
        # never all held beside the table (the encoded audio once, not twice).
        cut, rows = RecordingRows(self.schema), []
        try:
            with self._landed(recording["shard_id"]).sound_file(recording["audio_path"]) as sound:
                for key in sorted(keys, key=lambda k: self.segments["start_s"][self.position[k]].as_py() or 0.0):
                    try:
                        row = self._row(sound, key)
                    except (RuntimeError, ValueError, sf.LibsndfileError) as exc:
                        self.summary.errors[key] = f"cutting {recording['audio_path']} failed: {exc}"
                        continue
                    size = len(row["audio"]["bytes"]) + sum(len(str(v)) for k, v in row.items() if k != "audio")
                    rows.append((row, size))
                    if len(rows) == ROWS_PER_BATCH:
                        self._add_batch(cut, rows)
                        rows = []
        except (AudioNotFound, sf.LibsndfileError, RuntimeError) as exc:
            for key in keys:
                self.summary.errors.setdefault(
                    key, f"recording {recording['audio_path']} in shard {recording['shard_id']}: {exc}"
                )
        if rows:
            self._add_batch(cut, rows)
        self.summary.max_recording_buffer_bytes = max(self.summary.max_recording_buffer_bytes, cut.most_held)
        if not cut:
            return None, 0
        return cut, cut.payload

    def _add_batch(self, cut: RecordingRows, rows: list[tuple[dict, int]]) -> None:
        cut.add(pa.Table.from_pylist([row for row, _ in rows], schema=self.schema), sum(size for _, size in rows))

    def _row(self, sound: sf.SoundFile, identity: tuple[str, str]) -> dict:
        i = self.position[identity]
        shard_id, key = identity
        value = {name: self.segments[name][i].as_py() for name in self.segments.column_names}
        samples = downmix_to_mono(read_segment_from(sound, value["start_s"], value["end_s"]))
        if samples.size == 0:
            raise ValueError(f"segment {key} [{value['start_s']}, {value['end_s']}) s holds no samples")
        samples = resample(samples, sound.samplerate, self.sample_rate) if self.sample_rate else samples
        rate = self.sample_rate or sound.samplerate
        self.summary.audio_seconds += samples.shape[0] / rate
        start = float(value["start_s"] or 0.0)
        end = float(value["end_s"]) if value["end_s"] is not None else start + samples.shape[0] / rate
        return {
            "audio": {
                "bytes": encode_flac(np.asarray(samples, dtype=np.float32), rate),
                "path": f"{shard_id}/{key}.flac",
            },
            "key": key,
            "shard_id": shard_id,
            "country": self.country,
            "language": value["language"],
            "video_id": value["video_id"],
            "transcript_id": value["transcript_id"],
            "start_seconds": start,
            "end_seconds": end,
            "duration_seconds": end - start,
            "asr_transcript": value["asr_text"],
            "human_transcript": value["human_text"],
            "cer": value["cer"],
            # A pseudo-label has no human reference to score the landed ASR transcript against.
            "wer": None if value["human_text"] is None else word_error_rate(value["human_text"], value["asr_text"]),
            "original_transcript_start_idx": value["transcript_start_idx"],
            "original_transcript_end_idx": value["transcript_end_idx"],
            "text": value["text"],
            "text_source": value["text_source"],
            "asr_confidence": value["asr_confidence"],
        }

    def _landed(self, shard_id: str) -> LandedAudio:
        if self._audio is None or self._audio_shard != shard_id:
            if self._audio is not None:
                self._audio.close()
            self._audio, self._audio_shard = LandedAudio(self.data_root, shard_id), shard_id
        return self._audio

    @contextlib.contextmanager
    def sink(self, split: str, shard_id: str) -> Iterator[SplitSink]:
        """The files of one part, moved into place when the block ends without error."""
        sink = SplitSink(
            self.data_root, self.options.dataset, self.country, split, self.schema, self.max_file_bytes, shard_id
        )
        try:
            yield sink
        except BaseException:
            sink.abort()
            raise
        sink.finish()
