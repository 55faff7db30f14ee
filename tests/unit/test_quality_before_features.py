"""An utterance the bridge's quality decisions exclude never reaches the feature encoders."""

import numpy as np
import pyarrow as pa

from speechdata.features.models import tiny_qwen3
from speechdata.features.stage import QWEN_STAGE, run_qwen_hidden_states
from speechdata.io import layout
from speechdata.io.storage import DataRoot

EXCLUDED_TOKEN = 311


def test_the_qwen_forward_never_receives_an_excluded_utterance(tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    grids = pa.table(
        {
            "utt_id": ["kept_1", "dropped", "kept_2"],
            "tokens": [[5, 6, 7], [EXCLUDED_TOKEN] * 4, [8, 9]],
            "n_samples": [24_000, 24_000, 24_000],
        }
    )
    root.write_parquet(layout.frame_grids("s1"), grids)
    model = tiny_qwen3(512)
    seen: list[np.ndarray] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(
            (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).numpy()
        ),
        with_kwargs=True,
    )
    summary = run_qwen_hidden_states(
        root,
        "s1",
        model,
        device="cpu",
        max_batch_tokens=1024,
        excluded={"dropped": ("narrowband", "quality: bandwidth_hz 4000 Hz < 5000 Hz")},
    )
    assert seen and sum(batch.shape[0] for batch in seen) == 2
    assert not any((batch == EXCLUDED_TOKEN).any() for batch in seen)
    assert [(r.utt_id, r.stage, r.reason) for r in summary.rejects] == [("dropped", QWEN_STAGE, "narrowband")]
    assert summary.rows_in == 3 and summary.rows_out == 2
    rejects = root.read_parquet(layout.rejects("s1", QWEN_STAGE)).to_pylist()
    assert rejects[0]["reason"] == "narrowband" and "4000 Hz" in rejects[0]["detail"]


def test_the_wavlm_forward_never_receives_an_excluded_utterance(tmp_path):
    import torch

    from speechdata.audio.codec import encode_audio_payload
    from speechdata.audio.container import (
        AUDIO_CONTAINER_SCHEMA,
        CONTAINER_PARQUET_OPTIONS,
        AudioContainerWriter,
        EncodedUtterance,
    )
    from speechdata.features.models import tiny_wavlm
    from speechdata.features.stage import WAVLM_STAGE, run_wavlm_features

    root = DataRoot(str(tmp_path / "data"))
    rng = np.random.default_rng(0)
    lengths = {"kept_1": 24_000, "dropped": 36_000, "kept_2": 48_000}
    with root.parquet_writer(
        layout.normalized_audio("s1"), AUDIO_CONTAINER_SCHEMA, **CONTAINER_PARQUET_OPTIONS
    ) as parquet:
        container = AudioContainerWriter(parquet)
        for utt_id, n in lengths.items():
            samples = (rng.standard_normal(n) * 0.1).astype(np.float32)
            container.add(EncodedUtterance(utt_id, 24_000, n, "pcm16", encode_audio_payload(samples, 24_000, "pcm16")))
        container.flush()
    root.write_parquet(
        layout.frame_grids("s1"),
        pa.table({"utt_id": list(lengths), "n_frames": [-(-n // 1920) for n in lengths.values()]}),
    )
    model = tiny_wavlm()
    seen_samples: list[int] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: seen_samples.extend(
            [
                int(row.abs().gt(0).sum())
                for row in (kwargs.get("input_values") if "input_values" in kwargs else args[0])
            ]
        ),
        with_kwargs=True,
    )
    summary = run_wavlm_features(
        root,
        "s1",
        model,
        device="cpu",
        dtype=torch.float32,
        max_batch_s=100.0,
        excluded={"dropped": ("clipped", "quality: clipped_share 0.01 > 0.001")},
    )
    # Two rows reach the model (16 kHz: 1 s and 2 s), never the 1.5 s excluded one.
    assert len(seen_samples) == 2 and all(abs(n - 24_000) > 1_000 for n in seen_samples)
    assert [(r.utt_id, r.stage, r.reason) for r in summary.rejects] == [("dropped", WAVLM_STAGE, "clipped")]
    assert summary.rows_in == 3 and summary.rows_out == 2
