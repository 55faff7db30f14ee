"""DNSMOS P.835 (Reddy et al. 2022): speech (SIG), background (BAK) and overall (OVRL) MOS, 1-5.

The ONNX model ships inside the ``speechmos`` wheel (MIT) and runs on CPU with onnxruntime: the
same real model in every profile, with no download, so its filter is on in ``tiny`` too. The model
scores 9.01 s windows of 16 kHz audio; a shorter utterance is repeated to fill one (as the
reference implementation does), a longer one is scored in consecutive windows, the last ending at
the utterance's end, and the window scores averaged. The reference slides its window by 1 s,
scoring a long utterance up to nine times over; consecutive windows cost one model call per 9 s.
The P.808 model in the same wheel is not used (its mel front end needs librosa and a second call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
WINDOW_SAMPLES = int(9.01 * SAMPLE_RATE)
MODEL_FILE = "dnsmos_models/sig_bak_ovr.onnx"

# The P.835 model's raw outputs mapped to MOS, the reference's (non-personalized) polynomials.
_SIG = np.poly1d([-0.08397278, 1.22083953, 0.0052439])
_BAK = np.poly1d([-0.13166888, 1.60915514, -0.39604546])
_OVRL = np.poly1d([-0.06766283, 1.11546468, 0.04602535])


@dataclass(frozen=True)
class DnsmosScores:
    sig: float
    bak: float
    ovrl: float


def model_path() -> Path:
    """The P.835 ONNX file inside the installed ``speechmos`` package (nothing imported from it)."""
    import importlib.util

    spec = importlib.util.find_spec("speechmos")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("DNSMOS needs the speechmos package (pip install speechmos)")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise RuntimeError(f"{path}: the DNSMOS model is missing from the speechmos package")
    return path


def windows(audio_16k: np.ndarray) -> list[np.ndarray]:
    """The 9.01 s windows the model scores (see the module docstring)."""
    audio = np.asarray(audio_16k, np.float32)
    if audio.size == 0:
        return []
    if audio.size < WINDOW_SAMPLES:
        audio = np.tile(audio, -(-WINDOW_SAMPLES // audio.size))[:WINDOW_SAMPLES]
    starts = list(range(0, audio.size - WINDOW_SAMPLES + 1, WINDOW_SAMPLES))
    if starts[-1] + WINDOW_SAMPLES < audio.size:
        starts.append(audio.size - WINDOW_SAMPLES)
    return [audio[s : s + WINDOW_SAMPLES] for s in starts]


class Dnsmos:
    """DNSMOS P.835 on onnxruntime's CPU provider; ``threads`` intra-op threads (0: onnxruntime's default)."""

    def __init__(self, threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(model_path()), sess_options=options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def score(self, audios_16k: Sequence[np.ndarray]) -> list[DnsmosScores | None]:
        """One score per utterance, in input order; None for empty or all-zero audio."""
        results: list[DnsmosScores | None] = []
        for audio in audios_16k:
            if audio.size == 0 or not np.any(audio):
                results.append(None)
                continue
            raw = np.array(
                [self.session.run(None, {self.input_name: np.clip(w, -1.0, 1.0)[None]})[0][0] for w in windows(audio)]
            )
            sig, bak, ovrl = (float(np.mean(f(raw[:, i]))) for i, f in enumerate((_SIG, _BAK, _OVRL)))
            results.append(DnsmosScores(sig, bak, ovrl))
        return results
