"""The one entry point: every asset, check, job, sensor and resource of the code location."""

import dagster as dg

from assets import ALL_ASSETS
from dagster_project.jobs import ALL_JOBS
from dagster_project.settings import data_root_url, model_profile
from resources.profile import ModelProfileResource
from resources.storage import DataRootResource
from sensors.landing import landing_sensor


def build_resources(data_root: str | None = None, profile: str | None = None) -> dict:
    return {
        "data_root": DataRootResource(url=data_root or data_root_url()),
        "model_profile": ModelProfileResource(profile=profile or model_profile()),
    }


defs = dg.Definitions(
    assets=ALL_ASSETS,
    jobs=ALL_JOBS,
    sensors=[landing_sensor],
    resources=build_resources(),
)
