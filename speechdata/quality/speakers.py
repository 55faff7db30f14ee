"""Who speaks in an utterance: a speaker embedding, a speaker-count / overlap flag and per-shard clusters.

The embedding is Resemblyzer's GE2E speaker encoder (a 3-layer LSTM over 40-band mel frames,
256-d output, trained on VoxCeleb and LibriSpeech; the weights ship inside the ``Resemblyzer`` wheel,
Apache-2.0, so nothing is downloaded). The utterance's 16 kHz audio is cut into 1.6 s *windows*
(:data:`WINDOW_S`, the encoder's partial utterances) about 0.77 s apart; each window gets an
L2-normalized embedding, and the utterance's embedding is their L2-normalized mean.

- **Speaker count.** The windows are clustered (average linkage on cosine distance, cut at
  :data:`WINDOW_SAME_SPEAKER_MIN_COSINE`); the count is the number of clusters holding at least
  :data:`MIN_SPEAKER_WINDOWS` windows. ``speaker_overlap`` is set when two or more speakers are
  found, or when the windows disagree strongly (their least cosine to the utterance's embedding is
  below :data:`OVERLAP_MIN_WINDOW_COSINE`): a second voice, crosstalk or music under speech.
- **Clusters per shard.** The utterance embeddings of one shard, clustered the same way (average
  linkage, cut at :data:`SAME_SPEAKER_MIN_COSINE`), numbered by their first utterance in ``utt_id``
  order so the numbering is stable.

The same threshold tells the near-duplicate check whether two readings of one transcript are by
one speaker (docs/near-duplicates.md). Measured on the committed espeak-ng fixtures
(``tests/fixtures/readings``, 3 sentences by 4 readings): one voice reading one sentence twice at
two speeds scores 0.96-0.97, one voice across sentences 0.85-0.93; a male and a female voice 0.60-0.75,
two female voices 0.72-0.81. The threshold sits between. Windows of a male voice followed by a
female one split into two clusters; two voices speaking *at once* at similar loudness mostly do not
(their mixture reads as one voice): the flag finds speaker changes, not every overlap.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EMBEDDING_SIZE = 256
ENCODER_SAMPLE_RATE = 16_000
WINDOW_S = 1.6
"""The encoder's partial utterance: each window's embedding is one voice sample."""
WINDOWS_PER_SECOND = 1.3
"""Resemblyzer's default rate: windows overlap by about half."""
SAME_SPEAKER_MIN_COSINE = 0.83
"""Two utterance embeddings at least this close (cosine) are one speaker: a shard's clusters are cut
here, and two readings of one transcript this close are one speaker reading it twice (a duplicate)."""
WINDOW_SAME_SPEAKER_MIN_COSINE = 0.6
"""Windows (1.6 s each, so noisier than whole utterances) at least this close on average are one
speaker when an utterance's windows are clustered for its speaker count."""
OVERLAP_MIN_WINDOW_COSINE = 0.45
"""A window this far from its utterance's embedding is another voice (or no voice)."""
MAX_WINDOWS = 12
"""At most this many windows (evenly spread) are embedded per utterance: about 10 s of audio, which
bounds the encoder's cost per utterance however long it is."""
MIN_SPEAKER_WINDOWS = 2
"""A speaker must hold this many windows to count (one odd window is a cough, a laugh, a noise)."""
MIN_EMBEDDED_S = 0.5
"""Shorter audio (or audio with no sound) has no embedding: too little voice to tell a speaker."""


@dataclass(frozen=True)
class SpeakerSignals:
    """One utterance's speaker evidence. ``embedding`` float32 ``[256]`` L2-normalized, None when the
    audio is too short or silent; ``speakers``: 0 when there is no embedding."""

    embedding: np.ndarray | None
    speakers: int
    overlap: bool
    least_window_cosine: float | None


NO_SPEAKER = SpeakerSignals(None, 0, False, None)


BATCH_WINDOWS = 128
"""Windows (of however many utterances) embedded in one forward: one LSTM call over many windows
costs a fraction of one call per utterance, and the bound keeps memory flat however many utterances
a chunk holds."""
MEMO_UTTERANCES = 4096
"""Utterances whose window embeddings an encoder remembers (12 KB each at most): the near-duplicate
check and the quality signals of one shard read the same audio, and in one process the second pays nothing."""


class SpeakerEncoder:
    """Resemblyzer's voice encoder on a torch device; build it once per process
    (``resources.quality.QualityModelsResource.speaker_encoder`` or :func:`shipped_speaker_encoder`,
    the same instance for one device).

    Windows of many utterances go through the LSTM together (:data:`BATCH_WINDOWS` at a time), and
    an utterance's window embeddings are remembered by a digest of its samples
    (:data:`MEMO_UTTERANCES`), so audio embedded once in a process is not embedded again."""

    def __init__(self, device: str = "cpu"):
        from resemblyzer import VoiceEncoder

        self._encoder = VoiceEncoder(device=device, verbose=False)
        self.device = device
        self._memo: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._memo_lock = threading.Lock()
        if device == "cpu":
            # float64 on the CPU: processes whose BLAS is set up differently (a Ray worker, a Dagster
            # step) then agree far below the float16 the index stores, so its bytes do not depend
            # on where an embedding was computed. About twice the float32 cost, 3-4 % of real time.
            self._encoder.double()

    def window_embeddings(self, samples: np.ndarray, sample_rate: int) -> np.ndarray:
        """float32 ``[windows, 256]``, each L2-normalized, of mono float ``samples``; ``[0, 256]``
        for audio shorter than :data:`MIN_EMBEDDED_S` or without sound."""
        return self.window_embeddings_many([(samples, sample_rate)])[0]

    def window_embeddings_many(self, audios: Sequence[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """:meth:`window_embeddings` of each ``(samples, sample_rate)``, in input order, the windows
        of all of them embedded :data:`BATCH_WINDOWS` at a time."""
        from speechdata.audio.codec import resample

        results: list[np.ndarray | None] = [None] * len(audios)
        wavs = [resample(np.asarray(samples, np.float32), rate, ENCODER_SAMPLE_RATE) for samples, rate in audios]
        pending: dict[bytes, list[int]] = {}
        for number, key in enumerate(_audio_key(wav) for wav in wavs):
            remembered = self._remembered(key)
            if remembered is not None:
                results[number] = remembered
            else:
                pending.setdefault(key, []).append(number)
        mels: list[np.ndarray] = []
        spans: dict[bytes, slice] = {}
        for key, numbers in pending.items():
            windows = self._window_mels(wavs[numbers[0]])
            count = 0 if windows is None else len(windows)
            spans[key] = slice(len(mels), len(mels) + count)
            mels += [] if windows is None else list(windows)
        embedded = self._embed(mels)
        for key, numbers in pending.items():
            windows = embedded[spans[key]].copy()
            self._remember(key, windows)
            for number in numbers:
                results[number] = windows
        return results

    def window_count(self, samples: np.ndarray, sample_rate: int) -> int:
        """How many embeddings :meth:`window_embeddings` gives for this audio, found without the encoder
        (a long recording's windows are counted first, and only those its speaker signals keep are embedded)."""
        from speechdata.audio.codec import resample

        wav = resample(np.asarray(samples, np.float32), sample_rate, ENCODER_SAMPLE_RATE)
        if not _embeddable(wav):
            return 0
        _, mel_slices = self._encoder.compute_partial_slices(len(wav), WINDOWS_PER_SECOND, 0.75)
        return min(len(mel_slices), MAX_WINDOWS)

    def signals(self, samples: np.ndarray, sample_rate: int) -> SpeakerSignals:
        return speaker_signals(self.window_embeddings(samples, sample_rate))

    def signals_many(self, audios: Sequence[tuple[np.ndarray, int]]) -> list[SpeakerSignals]:
        """:meth:`signals` of each ``(samples, sample_rate)``, in input order, embedded together."""
        return [speaker_signals(windows) for windows in self.window_embeddings_many(audios)]

    def _window_mels(self, wav: np.ndarray) -> np.ndarray | None:
        """The mel frames ``[windows, frames, 40]`` of the windows of 16 kHz ``wav``; None for audio
        too short or without sound."""
        from resemblyzer import audio as resemblyzer_audio

        if not _embeddable(wav):
            return None
        # The encoder was trained on audio at -30 dBFS RMS: gain never changes who speaks.
        rms = float(np.sqrt(np.mean(wav.astype(np.float64) ** 2)))
        wav = wav * (10 ** (-30 / 20) / max(rms, 1e-9))
        wav_slices, mel_slices = self._encoder.compute_partial_slices(len(wav), WINDOWS_PER_SECOND, 0.75)
        if len(mel_slices) > MAX_WINDOWS:
            chosen = np.linspace(0, len(mel_slices) - 1, MAX_WINDOWS).round().astype(int)
            wav_slices, mel_slices = [wav_slices[i] for i in chosen], [mel_slices[i] for i in chosen]
        if wav_slices[-1].stop >= len(wav):
            wav = np.pad(wav, (0, wav_slices[-1].stop - len(wav)))
        mel = resemblyzer_audio.wav_to_mel_spectrogram(wav)
        return np.array([mel[s] for s in mel_slices])

    def _embed(self, mels: list[np.ndarray]) -> np.ndarray:
        """float32 L2-normalized embeddings ``[len(mels), 256]`` of equal-length mel windows."""
        import torch

        if not mels:
            return np.zeros((0, EMBEDDING_SIZE), np.float32)
        dtype = np.float64 if self.device == "cpu" else np.float32
        parts = []
        with torch.no_grad():
            for start in range(0, len(mels), BATCH_WINDOWS):
                batch = np.stack(mels[start : start + BATCH_WINDOWS]).astype(dtype)
                parts.append(self._encoder(torch.from_numpy(batch).to(self._encoder.device)).cpu().numpy())
        return _normalized(np.concatenate(parts).astype(np.float32))

    def forget(self) -> None:
        """Drop every remembered embedding (a benchmark's cold pass, a test's fresh computation)."""
        with self._memo_lock:
            self._memo.clear()

    def _remembered(self, key: bytes) -> np.ndarray | None:
        with self._memo_lock:
            found = self._memo.get(key)
            if found is not None:
                self._memo.move_to_end(key)
            return found

    def _remember(self, key: bytes, windows: np.ndarray) -> None:
        windows.setflags(write=False)  # shared by every caller that asks for the same audio
        with self._memo_lock:
            self._memo[key] = windows
            self._memo.move_to_end(key)
            while len(self._memo) > MEMO_UTTERANCES:
                self._memo.popitem(last=False)


def _embeddable(wav: np.ndarray) -> bool:
    """16 kHz audio long enough and loud enough to tell a speaker (:data:`MIN_EMBEDDED_S`)."""
    peak = float(np.abs(wav).max()) if len(wav) else 0.0
    return len(wav) >= MIN_EMBEDDED_S * ENCODER_SAMPLE_RATE and peak >= 1e-4


def _audio_key(wav: np.ndarray) -> bytes:
    """What the window embeddings are a function of: the 16 kHz float32 samples (so the quality
    signals, which pass audio already at 16 kHz, and the near-duplicate signals, which pass it at
    its stored rate, find each other's)."""
    return hashlib.blake2b(np.ascontiguousarray(wav, np.float32).tobytes(), digest_size=20).digest()


_SHIPPED: dict[str, SpeakerEncoder] = {}
_SHIPPED_LOCK = threading.Lock()


def shipped_speaker_encoder(device: str = "cpu") -> SpeakerEncoder:
    """The encoder with the weights shipped in the wheel, loaded once per process and device: for the
    steps that compute speaker evidence inside shared code (the near-duplicate signals, computed by
    the incremental stage, the batch pass and the index repair alike) and the quality signals, which
    so share its remembered embeddings."""
    with _SHIPPED_LOCK:
        if device not in _SHIPPED:
            _SHIPPED[device] = SpeakerEncoder(device)
        return _SHIPPED[device]


def _normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def speaker_signals(windows: np.ndarray) -> SpeakerSignals:
    """The utterance's embedding, speaker count and overlap flag from its window embeddings."""
    if len(windows) == 0:
        return NO_SPEAKER
    embedding = _normalized(windows.mean(axis=0))
    least = float((windows @ embedding).min())
    labels = cluster_embeddings(windows, WINDOW_SAME_SPEAKER_MIN_COSINE)
    sizes = np.bincount(labels)
    speakers = max(1, int((sizes >= MIN_SPEAKER_WINDOWS).sum()))
    return SpeakerSignals(embedding, speakers, speakers > 1 or least < OVERLAP_MIN_WINDOW_COSINE, round(least, 4))


def cluster_embeddings(embeddings: np.ndarray, min_cosine: float = SAME_SPEAKER_MIN_COSINE) -> np.ndarray:
    """int64 cluster labels of L2-normalized ``embeddings`` ``[n, d]``: average-linkage agglomerative
    clustering on cosine distance, cut where clusters are less than ``min_cosine`` alike on average.
    Labels are numbered by each cluster's first member, so the same input gives the same labels."""
    n = len(embeddings)
    if n == 0:
        return np.zeros(0, np.int64)
    if n == 1:
        return np.zeros(1, np.int64)
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import pdist

    distances = np.clip(pdist(np.asarray(embeddings, np.float64), "cosine"), 0.0, 2.0)
    tree = linkage(distances, method="average")
    raw = fcluster(tree, t=1.0 - min_cosine, criterion="distance")
    numbering: dict[int, int] = {}
    return np.array([numbering.setdefault(int(label), len(numbering)) for label in raw], np.int64)


def shard_speaker_clusters(embeddings: Sequence[np.ndarray | None]) -> list[int | None]:
    """Each utterance's speaker cluster in its shard (``embeddings`` in ``utt_id`` order; None for an
    utterance without an embedding, which gets no cluster)."""
    present = [number for number, embedding in enumerate(embeddings) if embedding is not None]
    clusters: list[int | None] = [None] * len(embeddings)
    if present:
        labels = cluster_embeddings(np.stack([embeddings[number] for number in present]))
        for number, label in zip(present, labels.tolist(), strict=True):
            clusters[number] = label
    return clusters


def speaker_cosine(first: np.ndarray | None, second: np.ndarray | None) -> float | None:
    """Cosine similarity of two L2-normalized embeddings; None when either is missing."""
    if first is None or second is None:
        return None
    return float(np.dot(np.asarray(first, np.float32), np.asarray(second, np.float32)))


def speaker_columns(evidence: dict[str, SpeakerSignals]) -> dict[str, dict]:
    """The quality file's speaker columns of every utterance in ``evidence`` (a shard's, by
    ``utt_id``): embedding, speaker count, overlap flag and the utterance's speaker cluster in the
    shard (numbered in ``utt_id`` order)."""
    utt_ids = sorted(evidence)
    clusters = shard_speaker_clusters([evidence[u].embedding for u in utt_ids])
    columns = {}
    for utt_id, cluster in zip(utt_ids, clusters, strict=True):
        found = evidence[utt_id]
        columns[utt_id] = {
            "speaker_embedding": None if found.embedding is None else found.embedding.tolist(),
            "speaker_count": found.speakers,
            "speaker_overlap": found.overlap,
            "speaker_cluster": cluster,
        }
    return columns
