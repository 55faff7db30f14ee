"""A feature stage's inputs for one shard, read before the model needs them.

A GPU worker reads the next shard's inputs while the current shard is on the device (one shard
ahead), so the forward passes never wait on the data root. The inputs are read only, never written:
reading them ahead of the shard's write lock is safe, and ``fingerprint`` lets the worker notice an
input replaced in between and read it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from speechdata.audio.codec import decode_audio, stored_frames
from speechdata.audio.streamed import StreamedAudio, is_long_form
from speechdata.io import layout
from speechdata.io.input_versions import InputFingerprint, fingerprint_is_current, input_fingerprint
from speechdata.io.storage import DataRoot


@dataclass(frozen=True)
class QwenShardInputs:
    """The frame grid columns the Qwen stage reads: which utterances, their tokens and lengths."""

    shard_id: str
    grids: pa.Table
    """``utt_id``, ``tokens``, ``n_samples``."""
    fingerprint: InputFingerprint


@dataclass(frozen=True)
class WavlmShardInputs:
    """The frame counts and the still-encoded 24 kHz audio the WavLM stage reads.

    The audio stays encoded in memory as stored (FLAC: a fraction of its decoded float32 size) and is
    decoded utterance by utterance as the stage consumes it."""

    shard_id: str
    n_frames: dict[str, int]
    audio: pa.Table
    """``utt_id``, ``sample_rate``, ``codec``, ``audio`` (encoded bytes) of the utterances in ``n_frames``."""
    fingerprint: InputFingerprint

    def iter_audio(self) -> Iterator[tuple[str, np.ndarray | StreamedAudio, int]]:
        """``(utt_id, samples float32 [n], sample_rate)`` in container order, decoded one at a time;
        one past the whole-decode budget as a :class:`StreamedAudio`, read window by window."""
        for utt_id, rate, codec, data in zip(
            self.audio["utt_id"].to_pylist(),
            self.audio["sample_rate"].to_pylist(),
            self.audio["codec"].to_pylist(),
            self.audio["audio"].to_pylist(),
            strict=True,
        ):
            n_samples = stored_frames(data, codec)
            if is_long_form(n_samples, rate):
                yield utt_id, StreamedAudio(data, codec, rate, n_samples, rate), rate
            else:
                yield utt_id, decode_audio(data, codec), rate


def read_qwen_inputs(data_root: DataRoot, shard_id: str) -> QwenShardInputs:
    relatives = [layout.frame_grids(shard_id)]
    fingerprint = input_fingerprint(data_root, relatives)
    grids = data_root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", "tokens", "n_samples"])
    return QwenShardInputs(shard_id, grids, fingerprint)


def read_wavlm_inputs(data_root: DataRoot, shard_id: str) -> WavlmShardInputs:
    relatives = [layout.frame_grids(shard_id), layout.normalized_audio(shard_id)]
    fingerprint = input_fingerprint(data_root, relatives)
    grids = data_root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", "n_frames"])
    n_frames = dict(zip(grids["utt_id"].to_pylist(), grids["n_frames"].to_pylist(), strict=True))
    audio = data_root.read_parquet(
        layout.normalized_audio(shard_id), columns=["utt_id", "sample_rate", "codec", "audio"]
    )
    wanted = pa.array([utt_id in n_frames for utt_id in audio["utt_id"].to_pylist()], pa.bool_())
    return WavlmShardInputs(shard_id, n_frames, audio.filter(wanted), fingerprint)


def inputs_are_current(data_root: DataRoot, inputs: QwenShardInputs | WavlmShardInputs) -> bool:
    """Whether every input file is still the version ``inputs`` was read from."""
    return fingerprint_is_current(data_root, inputs.fingerprint)
