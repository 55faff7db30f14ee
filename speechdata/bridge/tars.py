"""Pack a shard's bridge tuples into deterministic WebDataset tars.

One sample per utterance: ``<key>.wav`` (24 kHz mono 16-bit: the very samples ingest stored, whichever
16-bit codec stored them), ``<key>.qwen.npy``,
``<key>.wavlm.npy``, ``<key>.dur.npy``, ``<key>.grid.npy``, ``<key>.tokens.npy`` and ``<key>.json`` (text, language, ..., and ``words``: the word alignment as
``{"word", "start_ms", "end_ms"}`` dicts).
A recording longer than one training sample is packed as one sample per aligned segment, cut on
the Mimi clock (:mod:`speechdata.bridge.segments`). Samples are sorted by key and members by name; every header has mtime 0, uid/gid 0, empty owner
names and mode 0644, so packing the same inputs again gives byte-identical tars. A tar rolls over
to the next number before it would pass ``max_tar_bytes`` or ``max_samples``.
"""

from __future__ import annotations

import io
import json
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import soundfile as sf

from speechdata.alignment.pseudo_labels import (
    TEXT_SOURCE_ASR,
    TEXT_SOURCE_LANDED,
    needs_pseudo_label,
    read_pseudo_labels,
)
from speechdata.audio.clock import FRAME_RATE_HZ, SAMPLE_RATE
from speechdata.audio.codec import PCM16_CODECS, decode_audio, decode_pcm16
from speechdata.bridge.segments import SegmentCut, cut_grid, long_form_cuts, words_of
from speechdata.bridge.tar_members import npy_pieces, wav_pieces
from speechdata.bridge.tar_stream import BLOCK_BYTES, TarStream, byte_view
from speechdata.io import layout
from speechdata.io.keyed_stream import KeyedRows, read_ahead, read_keys
from speechdata.io.storage import DataRoot, atomic_open

DEFAULT_MAX_TAR_BYTES = 1_000_000_000
DEFAULT_MAX_SAMPLES = 10_000

BRIDGE_INDEX_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("tar_url", pa.string(), nullable=False),
        pa.field("tar_sha256", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class BridgeSample:
    key: str
    wav: np.ndarray
    """int16 samples are written as they are; float samples are quantized (``rint(x * 32767)``, clipped)."""
    qwen: np.ndarray
    wavlm: np.ndarray
    tokens: np.ndarray
    grid: np.ndarray
    dur: np.ndarray
    info: dict

    def members(self) -> list[tuple[str, tuple]]:
        """(name, payload buffers) of the sample's files, sorted by name (encoded once, then cached).

        Payloads are views where they can be (the stored audio, the feature matrices): nothing is
        copied before the tar write.
        """
        cached = self.__dict__.get("_members")
        if cached is None:
            files = {
                f"{self.key}.wav": wav_pieces(self.wav),
                f"{self.key}.qwen.npy": npy_pieces(self.qwen, np.float16),
                f"{self.key}.wavlm.npy": npy_pieces(self.wavlm, np.float16),
                f"{self.key}.tokens.npy": npy_pieces(self.tokens, np.int32),
                f"{self.key}.grid.npy": npy_pieces(self.grid, np.int32),
                f"{self.key}.dur.npy": npy_pieces(self.dur, np.int32),
                f"{self.key}.json": (json.dumps(self.info, sort_keys=True, ensure_ascii=False).encode(),),
            }
            cached = sorted(files.items())
            object.__setattr__(self, "_members", cached)  # frozen dataclass: set once, bypassing __setattr__
        return cached


@dataclass(frozen=True)
class PackedTar:
    relative: str
    """Where :func:`pack_samples` wrote it: the shard's staging folder."""
    url: str
    """Where it lives once committed (what the index and the manifest name)."""
    sha256: str
    samples: int
    bytes: int


def pack_samples(
    data_root: DataRoot,
    shard_id: str,
    samples: Iterator[BridgeSample],
    *,
    max_tar_bytes: int = DEFAULT_MAX_TAR_BYTES,
    max_samples: int = DEFAULT_MAX_SAMPLES,
) -> tuple[list[PackedTar], pa.Table]:
    """Write the samples (already sorted by key) into rolling tars; return the tars and the index.

    The tars are written to the shard's staging folder (:func:`layout.staged_bridge_tar`) while the
    index names their final paths, relative to the data root: nothing a reader sees changes until
    :func:`speechdata.bridge.commit.commit_bridge` swaps tars, index and manifest together. No sample
    means no tar and an empty index (an empty shard is a valid size).
    """
    staging = data_root.path(layout.bridge_staging_dir(shard_id))
    if data_root.fs.exists(staging):  # what a killed run left half-staged is never committed
        data_root.fs.rm(staging, recursive=True)
    tars: list[PackedTar] = []
    rows: list[dict] = []
    pending = iter(samples)
    sample = next(pending, None)
    number = 0
    while sample is not None:
        relative = layout.staged_bridge_tar(shard_id, number)
        tar_rows: list[dict] = []
        with atomic_open(data_root.fs, data_root.path(relative)) as handle:
            tar = TarStream(handle)
            try:
                while sample is not None:
                    members = sample.members()
                    size = sum(
                        BLOCK_BYTES + -(-sum(byte_view(p).nbytes for p in payload) // BLOCK_BYTES) * BLOCK_BYTES
                        for _, payload in members
                    )
                    if tar_rows and (tar.offset + size > max_tar_bytes or len(tar_rows) >= max_samples):
                        break
                    offset = tar.offset
                    tar.add_sample(members)
                    tar_rows.append({"key": sample.key, "offset": offset, "size": tar.offset - offset})
                    sample = next(pending, None)
                tar.close()
            except BaseException:
                tar.abort()
                raise
        digest = tar.hexdigest()
        final = layout.bridge_tar(shard_id, number, digest)  # named by content: known once written
        for row in tar_rows:
            row["tar_url"] = final
            row["tar_sha256"] = digest
        rows += tar_rows
        tars.append(PackedTar(relative, data_root.uri(final), digest, len(tar_rows), tar.offset))
        number += 1
    return tars, pa.Table.from_pylist(rows, schema=BRIDGE_INDEX_SCHEMA)


def remove_stale_tars(data_root: DataRoot, shard_id: str, keep: set[str]) -> None:
    """Remove the shard's tars in ``bridge/`` other than ``keep`` (relative paths): the versions no
    published manifest names any more. Another shard's tars are never touched."""
    wanted = {data_root.path(relative) for relative in keep}
    for path in data_root.glob(f"{layout.BRIDGE}/{shard_id}-*.tar"):
        if path not in wanted and layout.is_bridge_tar_of(shard_id, path.rsplit("/", 1)[-1]):
            data_root.fs.rm(path)


def word_alignments(data_root: DataRoot, shard_id: str) -> dict[str, list[dict]]:
    """Per utterance, its aligned words in order: ``{"word", "start_ms", "end_ms"}`` (ms from the
    start of the utterance's own audio), published in each sample's ``.json`` so that readers
    (and the moshi export) need no internal file."""
    table = data_root.read_parquet(
        layout.alignments(shard_id), columns=["utt_id", "level", "index", "text", "start_ms", "end_ms"]
    )
    by_utt: dict[str, list[tuple]] = {}
    for row in table.filter(pc.equal(table["level"], "word")).to_pylist():
        by_utt.setdefault(row["utt_id"], []).append((row["index"], row["text"], row["start_ms"], row["end_ms"]))
    return {
        utt: [{"word": w, "start_ms": s, "end_ms": e} for _, w, s, e in sorted(rows)] for utt, rows in by_utt.items()
    }


def words_in_key_order(data_root: DataRoot, shard_id: str, keys: list[str]) -> Iterator[list[dict]]:
    """:func:`word_alignments` of each of ``keys`` (sorted), one utterance at a time.

    The shard's words stay one sorted Arrow table (about 40 bytes a word) and become dicts only for
    the utterance being packed: as Python dicts for the whole shard they were 46 MB at 20 000
    utterances of 7 words, growing with the shard.
    """
    table = data_root.read_parquet(
        layout.alignments(shard_id), columns=["utt_id", "level", "index", "text", "start_ms", "end_ms"]
    )
    table = table.filter(pc.equal(table["level"], "word")).sort_by([("utt_id", "ascending"), ("index", "ascending")])
    if table.num_rows == 0:
        yield from ([] for _ in keys)
        return
    runs = table["utt_id"].combine_chunks().dictionary_encode()
    run_keys = runs.dictionary.to_pylist()
    codes = runs.indices.to_numpy()
    starts = np.concatenate([[0], np.flatnonzero(np.diff(codes)) + 1, [len(codes)]]).astype(np.int64)
    run = 0
    for key in keys:
        while run < len(starts) - 1 and run_keys[codes[starts[run]]] < key:
            run += 1
        if run < len(starts) - 1 and run_keys[codes[starts[run]]] == key:
            piece = table.slice(starts[run], starts[run + 1] - starts[run])
            yield [
                {"word": w, "start_ms": s, "end_ms": e}
                for w, s, e in zip(
                    piece["text"].to_pylist(), piece["start_ms"].to_pylist(), piece["end_ms"].to_pylist(), strict=True
                )
            ]
        else:
            yield []


def iter_bridge_samples(data_root: DataRoot, shard_id: str) -> Iterator[BridgeSample]:
    """Every utterance with a grid and both feature matrices, sorted by key: one sample each, or one
    per segment for a long recording (:mod:`speechdata.bridge.segments`).

    One pass over each input (:class:`~speechdata.io.keyed_stream.KeyedRows`): cost per utterance
    does not grow with the shard, and memory holds a row group per file, not the shard.
    """
    qwen_keys = set(read_keys(data_root, layout.qwen_hidden_states(shard_id)))
    wavlm_keys = set(read_keys(data_root, layout.wavlm_features(shard_id)))
    packable = sorted(set(read_keys(data_root, layout.frame_grids(shard_id))) & qwen_keys & wavlm_keys)
    del qwen_keys, wavlm_keys
    pseudo_labels = read_pseudo_labels(data_root, shard_id)
    segments = long_form_cuts(
        data_root,
        shard_id,
        data_root.read_parquet(
            layout.frame_grids(shard_id), columns=["utt_id", "n_samples", "n_frames", "token_start_ms", "token_end_ms"]
        ),
    )
    streams = zip(
        words_in_key_order(data_root, shard_id, packable),
        KeyedRows(data_root, layout.frame_grids(shard_id), GRID_COLUMNS, packable),
        KeyedRows(data_root, layout.utterance_index(shard_id), INFO_COLUMNS, packable),
        # The three payload files (99 % of the bytes) each read in their own thread.
        read_ahead(KeyedRows(data_root, layout.normalized_audio(shard_id), ["codec", "n_samples", "audio"], packable)),
        read_ahead(KeyedRows(data_root, layout.qwen_hidden_states(shard_id), ARRAY_COLUMNS, packable)),
        read_ahead(KeyedRows(data_root, layout.wavlm_features(shard_id), ARRAY_COLUMNS, packable)),
        strict=True,
    )

    def info(key: str, meta: dict, grid: dict, words: list[dict]) -> dict:
        return {
            **_text_and_source(meta["text"], pseudo_labels.get(key)),
            "language": meta["language"],
            "country": meta["country"],
            "source": meta["source"],
            "shard": shard_id,
            "sample_rate": SAMPLE_RATE,
            "frame_rate": FRAME_RATE_HZ,
            "n_frames": grid["n_frames"],
            "n_tokens": grid["n_tokens"],
            "words": words,
        }

    def build(
        key: str, words: list[dict], grid: dict, meta: dict, audio: dict, qwen: dict, wavlm: dict
    ) -> list[BridgeSample]:
        if key in segments:
            return _segment_samples(
                segments[key], words, grid, audio, _array(qwen), _array(wavlm), info(key, meta, grid, words)
            )
        sample = BridgeSample(
            key=key,
            wav=_stored_pcm(audio["audio"], audio["codec"]),
            qwen=_array(qwen),
            wavlm=_array(wavlm),
            tokens=grid["tokens"],
            grid=grid["grid"],
            dur=grid["dur"],
            info=info(key, meta, grid, words),
        )
        sample.members()  # encode here, in the worker thread
        return [sample]

    # Decoding FLAC (flac16 storage; libsndfile releases the GIL) runs in threads a bounded number of
    # samples ahead; samples are handed on in key order. With pcm16 storage building is a few views.
    with ThreadPoolExecutor(DECODE_THREADS) as pool:
        ahead: deque[Future] = deque()
        for key, rows in zip(packable, streams, strict=True):
            if rows[3]["codec"] == "pcm16":  # nothing to decode: a thread hand-off would cost more than the build
                ahead.append(Future())
                ahead[-1].set_result(build(key, *rows))
            else:
                ahead.append(pool.submit(build, key, *rows))
            if len(ahead) > 2 * DECODE_THREADS:
                yield from ahead.popleft().result()
        while ahead:
            yield from ahead.popleft().result()


def _segment_samples(
    cuts: list[SegmentCut],
    words: list[dict],
    grid: dict,
    audio: dict,
    qwen: np.ndarray,
    wavlm: np.ndarray,
    info: dict,
) -> list[BridgeSample]:
    """One sample per segment of a long recording: its audio, frames, tokens, features and words cut on
    the Mimi clock; ``segment`` in its json says where it lies in the recording."""
    samples = []
    with _StoredPcmRanges(audio["audio"], audio["codec"], audio["n_samples"]) as pcm:
        for cut in cuts:
            tokens, segment_grid, dur = cut_grid(cut, grid["tokens"], grid["grid"])
            samples.append(
                BridgeSample(
                    key=cut.key,
                    wav=pcm.read(cut.samples(audio["n_samples"])),
                    qwen=qwen[cut.first_token : cut.end_token],
                    wavlm=wavlm[cut.first_frame : cut.end_frame],
                    tokens=tokens,
                    grid=segment_grid,
                    dur=dur,
                    info={
                        **info,
                        "text": cut.text,
                        "n_frames": cut.n_frames,
                        "n_tokens": cut.n_tokens,
                        "words": words_of(cut, words),
                        "segment": {
                            "utt_id": cut.utt_id,
                            "index": cut.index,
                            "offset_ms": cut.offset_ms,
                            "first_frame": cut.first_frame,
                            "first_token": cut.first_token,
                        },
                    },
                )
            )
    return samples


class _StoredPcmRanges:
    """Sample ranges of one stored utterance, decoded range by range (never the whole recording):
    pcm16 is sliced in place; FLAC is read through one decoder over the payload, seeking to each range."""

    def __init__(self, data, codec: str, n_samples: int):
        self.data, self.codec, self.n_samples = data, codec, n_samples
        self._sound: sf.SoundFile | None = None

    def __enter__(self) -> _StoredPcmRanges:
        if self.codec != "pcm16":
            source = io.BytesIO(self.data) if isinstance(self.data, bytes) else pa.BufferReader(self.data)
            self._sound = sf.SoundFile(source)
        return self

    def __exit__(self, *exc) -> None:
        if self._sound is not None:
            self._sound.close()

    def read(self, samples: slice) -> np.ndarray:
        if self._sound is None:
            return np.frombuffer(self.data, dtype="<i2")[samples]
        self._sound.seek(samples.start)
        count = samples.stop - samples.start
        if self.codec == "flac16":
            return self._sound.read(count, dtype="int16").astype("<i2", copy=False)
        return self._sound.read(count, dtype="float32")  # flac24: quantized to 16 bits like any float audio


def _text_and_source(landed: str | None, label: tuple[str, float] | None) -> dict:
    """The sample's ``text`` and ``text_source``: the landed text, or the aligner's pseudo-label
    (with its ``asr_confidence``) for an utterance landed without text."""
    if label is not None and needs_pseudo_label(landed):
        return {"text": label[0], "text_source": TEXT_SOURCE_ASR, "asr_confidence": label[1]}
    return {"text": landed, "text_source": TEXT_SOURCE_LANDED}


DECODE_THREADS = min(4, os.cpu_count() or 1)
GRID_COLUMNS = ["tokens", "grid", "dur", "n_frames", "n_tokens"]
INFO_COLUMNS = ["text", "language", "country", "source"]
ARRAY_COLUMNS = ["n_rows", "dim", "dtype", "data"]


def _stored_pcm(data, codec: str) -> np.ndarray:
    """The stored 16-bit integers, for the WAV member to carry exactly what ingest stored (and what
    the feature stages read: ``decode_audio`` is these over 32768); flac24 has more bits, so it is
    quantized to 16 like any float audio."""
    if codec in PCM16_CODECS:
        return decode_pcm16(data, codec)
    return decode_audio(data, codec)


def _array(row: dict) -> np.ndarray:
    return np.frombuffer(row["data"], dtype=row["dtype"]).reshape(row["n_rows"], row["dim"])
