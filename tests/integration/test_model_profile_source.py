"""One source for the model profile: what the resources run and what the code versions record agree.

``build_definitions(profile=X)`` reads the profile once and passes it to the resources and to the
code versions of every asset whose output depends on a model, whatever ``SPEECHDATA_PROFILE``
says; ``build_resources`` alone refuses a profile whose models the imported assets do not record.
"""

import pytest

from dagster_project.loader import build_definitions, build_resources
from resources.aligner import profile_alignment_models
from resources.model_pins import MODEL_BOUND_ASSETS, QWEN, WAVLM, model_that_runs
from speechdata.profiles import PROFILES

OTHER_PROFILE = {"tiny": "full", "small": "full", "full": "tiny"}


@pytest.mark.parametrize("profile", PROFILES)
def test_build_definitions_records_the_models_its_resources_run(profile, monkeypatch, tmp_path):
    monkeypatch.setenv("SPEECHDATA_PROFILE", OTHER_PROFILE[profile])
    defs = build_definitions(data_root=str(tmp_path), profile=profile)
    graph = defs.resolve_asset_graph()
    assert set(MODEL_BOUND_ASSETS) == {"qwen_hidden_states", "wavlm_features", "frame_grids"}
    for name, pin in MODEL_BOUND_ASSETS.items():
        code_version = graph.get(dg_key(name)).code_version
        assert code_version.endswith(model_that_runs(pin, profile).identity), (name, code_version)
    resources = defs.resources
    assert resources["model_profile"].profile == profile
    assert resources["aligner"].models == profile_alignment_models(profile)
    runs_production = profile == "full"
    assert (resources["qwen"].model_id == QWEN.model_id) is runs_production
    assert (resources["wavlm"].model_id == WAVLM.model_id) is runs_production
    assert (resources["text_tokenizer"].model_id == QWEN.model_id) is runs_production


def test_the_small_profile_aligns_its_trained_languages_with_the_trained_model():
    models = profile_alignment_models("small")
    assert models["en"] == models["de"] == "small"
    assert models["fr"] == "tiny"
    assert set(profile_alignment_models("tiny").values()) == {"tiny"}


def test_build_resources_refuses_a_profile_the_imported_assets_do_not_record(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEECHDATA_PROFILE", "full")
    with pytest.raises(ValueError, match="SPEECHDATA_PROFILE=tiny.*build_definitions"):
        build_resources(str(tmp_path), profile="tiny")
    monkeypatch.setenv("SPEECHDATA_PROFILE", "tiny")
    # small runs the same tiny stand-ins as tiny for every model the code versions name.
    assert build_resources(str(tmp_path), profile="small")["aligner"].models == profile_alignment_models("small")
    with pytest.raises(ValueError, match="not a profile"):
        build_resources(str(tmp_path), profile="medium")


def dg_key(name: str):
    import dagster as dg

    return dg.AssetKey(name)
