"""The duty-cycle benchmark's model writer: each model in its real format, loaded back whole by the resource's call."""

import json

import pytest

from benchmarks.model_load_costs import MODELS, expected_parameters, measure_model_load, model_folder

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


@pytest.mark.parametrize("spec", MODELS, ids=lambda spec: spec.name)
def test_a_written_model_is_safetensors_and_loads_back_with_every_parameter(spec, tmp_path):
    figures = measure_model_load(spec.name, tiny=True, cache_dir=tmp_path, warm=False)
    folder = model_folder(spec.name, tiny=True, cache_dir=tmp_path)
    assert list(folder.glob("*.safetensors")), sorted(p.name for p in folder.iterdir())
    config = json.loads((folder / "config.json").read_text())
    assert config["dtype"] == spec.stored_dtype
    assert figures["format"] == "safetensors"
    assert figures["parameters"] == figures["expected_parameters"] == expected_parameters(spec.name, tiny=True)
    assert figures["load_dtype"] == spec.load_dtype
    assert figures["cold_load_s"] > 0 and figures["cold_gb_per_s"] > 0
    # A second call reuses the folder instead of writing it again.
    assert measure_model_load(spec.name, tiny=True, cache_dir=tmp_path, warm=False)["write_s"] is None
