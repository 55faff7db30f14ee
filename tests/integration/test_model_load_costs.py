"""The duty-cycle benchmark's model writer: each model in its real format, loaded back whole by the resource's call."""

import json

import pytest
from safetensors import safe_open

from benchmarks import model_load_costs
from benchmarks.model_load_costs import (
    MODELS,
    build_model,
    checkpoint_tensors,
    expected_parameters,
    measure_model_loads,
    model_folder,
    write_model,
)

pytestmark = pytest.mark.slow

# Parameters per the model cards (and mT5-XL's for MetricX-24 hybrid XL).
CARD_PARAMETERS = {
    "parakeet-ctc-1.1b": 1.1e9,
    "qwen3-1.7b": 1.7e9,
    "wavlm-large": 0.316e9,
    "metricx-24-hybrid-xl": 3.7e9,
}


@pytest.mark.parametrize("name", list(CARD_PARAMETERS))
def test_the_real_configs_have_the_model_cards_sizes(name):
    assert expected_parameters(name, tiny=False) == pytest.approx(CARD_PARAMETERS[name], rel=0.05)


def test_each_written_model_is_safetensors_and_loads_back_with_every_parameter(tmp_path):
    names = [spec.name for spec in MODELS]
    # Every write, then every load, in one interpreter each (the smoke run's shortcut).
    loads = measure_model_loads(names, tiny=True, cache_dir=tmp_path, warm=False, one_process=True)
    for spec in MODELS:
        figures = loads[spec.name]
        folder = model_folder(spec.name, tiny=True, cache_dir=tmp_path)
        assert list(folder.glob("*.safetensors")), sorted(p.name for p in folder.iterdir())
        assert json.loads((folder / "config.json").read_text())["dtype"] == spec.stored_dtype
        assert figures["format"] == "safetensors"
        assert figures["parameters"] == figures["expected_parameters"] == expected_parameters(spec.name, tiny=True)
        assert figures["load_dtype"] == spec.load_dtype
        assert figures["write_s"] > 0 and figures["cold_load_s"] > 0 and figures["cold_gb_per_s"] > 0
    # A second measurement reuses the folder instead of writing it again, and loads the model in an
    # interpreter of its own, as the full benchmark measures them. One model proves that mode: the
    # per-model loading code is the one the first measurement ran for every model.
    again = measure_model_loads(names[:1], tiny=True, cache_dir=tmp_path, warm=False)
    assert set(again) == {names[0]}
    assert all(figures["write_s"] is None for figures in again.values())
    assert {name: figures["parameters"] for name, figures in again.items()} == {names[0]: loads[names[0]]["parameters"]}
    assert all(figures["cold_load_s"] > 0 and figures["cold_gb_per_s"] > 0 for figures in again.values())
    assert {name: figures["load_dtype"] for name, figures in again.items()} == {names[0]: MODELS[0].load_dtype}


@pytest.mark.parametrize("spec", MODELS, ids=lambda spec: spec.name)
def test_the_streaming_writer_writes_what_save_pretrained_writes(spec, tmp_path):
    """Same tensors (names, shapes, dtypes) and config as ``save_pretrained`` of the built model."""
    write_model(spec.name, tmp_path / "streamed", tiny=True)
    build_model(spec.name, tiny=True).save_pretrained(tmp_path / "saved")

    def tensors(folder):
        found = {}
        for path in folder.glob("*.safetensors"):
            with safe_open(str(path), "pt") as checkpoint:
                for key in checkpoint.keys():  # noqa: SIM118 (safe_open is not iterable)
                    found[key] = (checkpoint.get_slice(key).get_shape(), checkpoint.get_slice(key).get_dtype())
        return found

    assert tensors(tmp_path / "streamed") == tensors(tmp_path / "saved")
    assert json.loads((tmp_path / "streamed" / "config.json").read_text()) == json.loads(
        (tmp_path / "saved" / "config.json").read_text()
    )


def test_a_large_checkpoint_is_cut_into_indexed_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(model_load_costs, "SHARD_BYTES", 20_000)
    write_model("wavlm-large", tmp_path, tiny=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) > 1 and set(index["weight_map"].values()) == set(files)
    assert len(index["weight_map"]) == len(checkpoint_tensors("wavlm-large", tiny=True))
