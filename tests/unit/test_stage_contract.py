"""Every per-shard stage of ``speechdata`` follows the one contract of ``speechdata/stage.py``."""

import importlib
import inspect

from speechdata.stage import StageSummary

STAGE_MODULES = [
    "speechdata.landing.ingest",
    "speechdata.alignment.stage",
    "speechdata.bridge.grid_stage",
    "speechdata.features.stage",
    "speechdata.asr.flac",
    "speechdata.vad.stage",
    "speechdata.translation.stage",
    "speechdata.translation.qe_stage",
]

STAGES_BY_PRODUCT = {
    "raw_shards": "run_raw_shards",
    "normalized_audio": "run_normalized_audio",
    "alignments": "run_alignments",
    "frame_grids": "run_frame_grids",
    "qwen_hidden_states": "run_qwen_hidden_states",
    "wavlm_features": "run_wavlm_features",
    "asr_flac": "run_asr_flac",
    "vad_segments": "run_vad_segments",
    "streaming_segments": "run_streaming_segments",
    "qe_scores": "run_qe_scores",
    "streaming_pairs": "run_streaming_pairs",
}
"""The shard products a single stage call builds. (``bridge_tars`` and ``shard_manifest`` are staged
and committed together by the packaging assets.)"""


def stage_entry_points() -> dict[str, object]:
    found = {}
    for name in STAGE_MODULES:
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if attribute.startswith("run_") and inspect.isfunction(value) and value.__module__ == name:
                found[attribute] = value
    return found


def test_every_shard_product_has_its_run_function():
    assert set(STAGES_BY_PRODUCT.values()) <= set(stage_entry_points())


def test_every_stage_takes_the_data_root_and_the_shard_and_returns_a_stage_summary():
    for name, function in stage_entry_points().items():
        assert name.startswith(tuple(f"run_{product}" for product in STAGES_BY_PRODUCT)), name
        assert list(inspect.signature(function).parameters)[:2] == ["data_root", "shard_id"], name
        # The return annotation alone: a parameter's may name a model library the module imports only
        # for type checking (the code location imports no model library).
        returned = inspect.signature(function).return_annotation
        if isinstance(returned, str):
            returned = eval(returned, function.__globals__)  # noqa: S307 - the module's own annotation
        assert inspect.isclass(returned) and issubclass(returned, StageSummary), (name, returned)
