"""The alignment stage's inputs for one shard, read before the CTC model needs them.

A GPU worker reads the next shard's inputs while the current shard is on the device (one shard
ahead): the transcripts and languages of the utterance index, and the audio decoded and resampled
to the models' 16 kHz, which is most of the stage's CPU time. The inputs are read only, never
written, so reading them ahead of the shard's write lock is safe; ``fingerprint`` lets the worker
notice an input replaced in between and read it again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from speechdata.alignment.log_probs import MODEL_SAMPLE_RATE
from speechdata.alignment.streamed_audio import StreamedAudio, model_audio
from speechdata.audio.budget import MAX_LONG_FORM_SECONDS
from speechdata.audio.container import iter_container_payloads
from speechdata.io import layout
from speechdata.io.input_versions import InputFingerprint, fingerprint_is_current, input_fingerprint
from speechdata.io.storage import DataRoot


@dataclass(frozen=True)
class UtteranceAudio:
    """One utterance of the audio container, at its stored rate's length and resampled for the model."""

    utt_id: str
    n_samples: int
    sample_rate: int
    """The stored audio's rate: ``n_samples / sample_rate`` is the duration the stage checks and reports."""
    audio_16k: np.ndarray | StreamedAudio | None
    """float32 samples at ``MODEL_SAMPLE_RATE`` (a long utterance's streamed in windows); None for an utterance no model will see (not in the
    index, or in a language without a configured model): it is a reject whatever the model."""


@dataclass(frozen=True)
class AlignmentShardInputs:
    """Everything the alignment stage reads from the data root for one shard.

    Memory: 64 KB per second of aligned audio (float32 at 16 kHz), so about 0.5 GB for a 2.2-hour
    shard; a worker holds at most one shard read ahead besides the one it computes."""

    shard_id: str
    utterances: dict[str, dict]
    """``{utt_id: {"utt_id", "text", "language"}}`` from the utterance index."""
    audio: list[UtteranceAudio]
    """Every row of the audio container, in container order."""
    fingerprint: InputFingerprint


def read_utterance_rows(data_root: DataRoot, shard_id: str) -> dict[str, dict]:
    """``{utt_id: {"utt_id", "text", "language"}}`` of the shard's utterance index."""
    index = data_root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id", "text", "language"])
    return {row["utt_id"]: row for row in index.to_pylist()}


def read_alignment_inputs(
    data_root: DataRoot, shard_id: str, languages: Collection[str] | None = None
) -> AlignmentShardInputs:
    """The shard's transcripts and its audio resampled to 16 kHz.

    ``languages``: those with a configured model (the aligner resource's ``models``); the audio of
    other languages is not decoded, since those utterances are rejects. None decodes every indexed one."""
    fingerprint = input_fingerprint(data_root, [layout.utterance_index(shard_id), layout.normalized_audio(shard_id)])
    utterances = read_utterance_rows(data_root, shard_id)
    audio = []
    for utt_id, n_samples, rate, codec, data in iter_container_payloads(data_root, layout.normalized_audio(shard_id)):
        row = utterances.get(utt_id)
        aligned = row is not None and (languages is None or (row["language"] or "") in languages)
        aligned = aligned and n_samples <= MAX_LONG_FORM_SECONDS * rate  # past it: a reject, never decoded
        audio_16k = model_audio(data, codec, rate, n_samples, MODEL_SAMPLE_RATE) if aligned else None
        audio.append(UtteranceAudio(utt_id, n_samples, rate, audio_16k))
    return AlignmentShardInputs(shard_id, utterances, audio, fingerprint)


def alignment_inputs_are_current(data_root: DataRoot, inputs: AlignmentShardInputs) -> bool:
    """Whether the utterance index and the audio container are still the versions ``inputs`` was read from."""
    return fingerprint_is_current(data_root, inputs.fingerprint)
