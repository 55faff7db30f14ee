"""What the quality stage asks of its audio models: a language ID and a speech-quality (MOS) score.

Both take 16 kHz mono float32 utterances and answer one value per utterance, in input order. The
resources (``resources/quality.py``) build them from real models; tests pass any object with the
same method (a classifier with fixed outputs, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

MODEL_SAMPLE_RATE = 16_000


class AudioLanguageIdentifier(Protocol):
    def identify(self, audios_16k: Sequence[np.ndarray]) -> list[tuple[str, float]]:
        """``(ISO 639 code, probability)`` of the most probable spoken language of each utterance."""


class SpeechQualityEstimator(Protocol):
    def mos(self, audios_16k: Sequence[np.ndarray]) -> list[float]:
        """A mean-opinion-score estimate (1 bad to 5 excellent) of each utterance."""


class DnsmosScorer(Protocol):
    def score(self, audios_16k: Sequence[np.ndarray]) -> list:
        """DNSMOS ``sig``/``bak``/``ovrl`` of each utterance (:class:`speechdata.quality.dnsmos.DnsmosScores`), or None."""


ISO_639_3_TO_1 = {
    "eng": "en",
    "deu": "de",
    "fra": "fr",
    "spa": "es",
    "ita": "it",
    "por": "pt",
    "nld": "nl",
    "pol": "pl",
    "rus": "ru",
    "cmn": "zh",
    "jpn": "ja",
    "kor": "ko",
    "ara": "ar",
    "hin": "hi",
    "tur": "tr",
    "ukr": "uk",
    "ces": "cs",
    "swe": "sv",
}
"""MMS-LID labels are ISO 639-3; the landed ``language`` and the text LID use ISO 639-1 where one exists."""


def language_code(label: str) -> str:
    """A classifier label (``eng``, ``en``, ``en: English``) as the code the landed labels use."""
    code = label.split(":", 1)[0].strip().lower()
    return ISO_639_3_TO_1.get(code, code)


class _AudioModel:
    """A transformers audio model and its feature extractor, run over 16 kHz audio in bounded batches."""

    def __init__(self, model, feature_extractor, device: str = "cpu", max_batch_s: float = 120.0):
        self.model, self.feature_extractor, self.device, self.max_batch_s = (
            model,
            feature_extractor,
            device,
            max_batch_s,
        )

    def _logits(self, audios_16k: Sequence[np.ndarray]):
        """The model's logits, one batch of at most ``max_batch_s`` padded seconds at a time."""
        import torch

        for batch in _batches(audios_16k, self.max_batch_s):
            inputs = self.feature_extractor(
                [a for a in batch], sampling_rate=MODEL_SAMPLE_RATE, return_tensors="pt", padding=True
            )
            with torch.inference_mode():
                yield self.model(**{k: v.to(self.device) for k, v in inputs.items()}).logits


LANGUAGE_ID_PIECE_S = 30.0
"""The language ID hears an utterance in pieces of at most this length: its convolutions hold the
whole input's features and its attention grows with the square of it (the tiny model took 614 MB and
112 s over a 10-minute utterance whole, the full MMS-LID's first layer alone would ask gigabytes); a
longer utterance's language is the most probable one over its pieces' probabilities averaged by
length. An utterance up to one piece is heard whole, as before."""


class AudioClassifierLanguageId(_AudioModel):
    """Spoken-language ID with a transformers ``AutoModelForAudioClassification`` (MMS-LID, VoxLingua107)."""

    def identify(self, audios_16k: Sequence[np.ndarray]) -> list[tuple[str, float]]:
        import torch

        labels = self.model.config.id2label
        pieces, owners = [], []
        for number, audio in enumerate(audios_16k):
            for start, stop in _pieces(len(audio), int(LANGUAGE_ID_PIECE_S * MODEL_SAMPLE_RATE)):
                pieces.append(audio[start:stop])
                owners.append((number, stop - start))
        summed: list = [None] * len(audios_16k)
        weights = [0] * len(audios_16k)
        rows = iter(owners)
        for logits in self._logits(pieces):
            for probabilities in torch.softmax(logits.float(), dim=-1).cpu():
                number, length = next(rows)
                weighted = probabilities.double() * max(length, 1)
                summed[number] = weighted if summed[number] is None else summed[number] + weighted
                weights[number] += max(length, 1)
        results: list[tuple[str, float]] = []
        for total, weight in zip(summed, weights, strict=True):
            probabilities = total / weight
            best = int(probabilities.argmax())
            results.append((language_code(labels[best]), float(probabilities[best])))
        return results


def _pieces(length: int, piece: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive pieces of at most ``piece`` samples covering ``length``; a last
    piece under a second joins the one before (a scrap would weigh little and say less)."""
    starts = list(range(0, max(length, 1), piece))
    if len(starts) > 1 and length - starts[-1] < MODEL_SAMPLE_RATE:
        starts.pop()
    return list(zip(starts, starts[1:] + [length], strict=True))


class RegressionHeadMos(_AudioModel):
    """MOS from a transformers audio model with one regression output (``num_labels=1``), clamped to 1-5."""

    def mos(self, audios_16k: Sequence[np.ndarray]) -> list[float]:
        scores: list[float] = []
        for logits in self._logits(audios_16k):
            scores += [float(min(5.0, max(1.0, v))) for v in logits[:, 0].float().cpu().tolist()]
        return scores


MAX_PADDED_ATTENTION_S2 = 1800.0
"""A batch's utterances times the square of its longest one's seconds stays under this. Padding a
batch makes the models attend with a mask, where PyTorch's attention builds the whole ``[T, T]``
score matrix per utterance and head (a 60 s utterance padded beside a 3 s one took the tiny language
ID 1.4 GB; two near 120 s, the old batch's bound, would take 5-6 GB); an utterance alone is not
padded. 1 800 s^2 keeps eight 15 s utterances in one batch."""


def _batches(
    audios: Sequence[np.ndarray], max_batch_s: float, max_padded_attention_s2: float = MAX_PADDED_ATTENTION_S2
):
    """Consecutive batches of at most ``max_batch_s`` seconds and :data:`MAX_PADDED_ATTENTION_S2`."""
    batch: list[np.ndarray] = []
    seconds = longest_s = 0.0
    for audio in audios:
        length_s = audio.shape[0] / MODEL_SAMPLE_RATE
        padded = (len(batch) + 1) * max(longest_s, length_s) ** 2
        if batch and (seconds + length_s > max_batch_s or padded > max_padded_attention_s2):
            yield batch
            batch, seconds, longest_s = [], 0.0, 0.0
        batch.append(audio)
        seconds += length_s
        longest_s = max(longest_s, length_s)
    if batch:
        yield batch


SQUIM_PIECE_S = 5.0
"""SQUIM scores audio in pieces of at most this length (its attention grows with the square of it:
200 MB for a 10 s piece, which took a run of every shard asset past a 3 GB data-segment cap)."""


class SquimObjectiveMos:
    """MOS from torchaudio's SQUIM objective model: its PESQ estimate (MOS-LQO, about 1-4.5), no reference needed."""

    def __init__(self, model, device: str = "cpu"):
        self.model, self.device = model, device

    def mos(self, audios_16k: Sequence[np.ndarray]) -> list[float | None]:
        import torch

        scores: list[float | None] = []
        piece = int(SQUIM_PIECE_S * MODEL_SAMPLE_RATE)
        with torch.inference_mode():
            for audio in audios_16k:  # one at a time: padding would read as silence and lower the score
                # In pieces: SQUIM attends over its whole input (a 60 s one asked for 7.2 GB); the
                # pieces' scores are averaged by length. A last piece under a second joins the one before.
                starts = list(range(0, max(len(audio), 1), piece))
                if len(starts) > 1 and len(audio) - starts[-1] < MODEL_SAMPLE_RATE:
                    starts.pop()
                bounds = list(zip(starts, starts[1:] + [len(audio)], strict=True))
                weighted, total = 0.0, 0
                for start, stop in bounds:
                    chunk = np.ascontiguousarray(audio[start:stop], dtype=np.float32)
                    _stoi, pesq, _si_sdr = self.model(torch.from_numpy(chunk)[None].to(self.device))
                    score = float(pesq[0])
                    if np.isfinite(score):  # silence: the model divides by its zero level
                        weighted, total = weighted + score * (stop - start), total + (stop - start)
                scores.append(weighted / total if total else None)
        return scores
