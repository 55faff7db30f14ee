"""One source for the model profile: what the resources run and what the code versions record agree.

``build_definitions(profile=X)`` reads the profile once and passes it to the resources and to the
code versions of every asset whose output depends on a model, whatever ``SPEECHDATA_PROFILE``
says; ``build_resources`` alone refuses a profile whose models the imported assets do not record.
"""

import pytest

from dagster_project.loader import build_definitions, build_resources
from resources.aligner import PARAKEET, profile_alignment_models, small_aligner_identity
from resources.model_pins import MODEL_BOUND_ASSETS, QWEN, WAVLM
from speechdata.profiles import PROFILES

OTHER_PROFILE = {"tiny": "full", "small": "full", "full": "tiny"}
MODEL_BOUND = {"alignments", "frame_grids", "qwen_hidden_states", "wavlm_features"}


def model_bound_code_versions(profile: str, data_root: str) -> dict[str, str]:
    graph = build_definitions(data_root=data_root, profile=profile).resolve_asset_graph()
    return {name: graph.get(dg_key(name)).code_version for name in MODEL_BOUND}


@pytest.mark.parametrize("profile", PROFILES)
def test_build_definitions_records_the_models_its_resources_run(profile, monkeypatch, tmp_path):
    monkeypatch.setenv("SPEECHDATA_PROFILE", OTHER_PROFILE[profile])
    defs = build_definitions(data_root=str(tmp_path), profile=profile)
    graph = defs.resolve_asset_graph()
    assert set(MODEL_BOUND_ASSETS) == MODEL_BOUND
    resources = defs.resources
    # Each model-bound code version ends with the identity of the resource that runs its model.
    runs = {
        "alignments": resources["aligner"].identity,
        "frame_grids": resources["text_tokenizer"].identity,
        "qwen_hidden_states": resources["qwen"].model_that_runs.identity,
        "wavlm_features": resources["wavlm"].model_that_runs.identity,
    }
    for name, identity in runs.items():
        code_version = graph.get(dg_key(name)).code_version
        assert code_version.endswith(identity), (name, code_version)
    assert resources["model_profile"].profile == profile
    assert resources["aligner"].models == profile_alignment_models(profile)
    for key in ("qwen", "wavlm", "text_tokenizer", "quality_models", "qe"):
        assert resources[key].profile == profile, key
    # A Hub id field holds a Hub id in every profile; the profile says whether its tiny twin runs.
    assert resources["qwen"].model_id == resources["text_tokenizer"].model_id == QWEN.model_id
    assert resources["wavlm"].model_id == WAVLM.model_id
    runs_production = profile == "full"
    assert (resources["qwen"].model_that_runs.identity == QWEN.identity) is runs_production
    assert ("tiny" in resources["quality_models"].identity) is not runs_production


def test_the_alignments_code_version_names_the_aligner_each_profile_runs(tmp_path):
    versions = {profile: model_bound_code_versions(profile, str(tmp_path))["alignments"] for profile in PROFILES}
    assert len(set(versions.values())) == len(PROFILES), versions
    assert versions["full"].endswith(f"{PARAKEET.identity}[en]")
    assert "small@model-" in versions["small"] and "emission_calibration-" in versions["small"]
    assert "small@" not in versions["tiny"]
    # Recomputed from the files (not a cached value), a second build of one profile records the same.
    small_aligner_identity.cache_clear()
    assert model_bound_code_versions("small", str(tmp_path))["alignments"] == versions["small"]


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
    # small runs tiny's encoders but another aligner, which the alignments code version names.
    with pytest.raises(ValueError, match="SPEECHDATA_PROFILE=small"):
        build_resources(str(tmp_path), profile="small")
    assert build_resources(str(tmp_path), profile="tiny")["aligner"].models == profile_alignment_models("tiny")
    with pytest.raises(ValueError, match="not a profile"):
        build_resources(str(tmp_path), profile="medium")


def dg_key(name: str):
    import dagster as dg

    return dg.AssetKey(name)
