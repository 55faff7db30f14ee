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
