"""The deployed code location, with asset code versions overridden from a JSON file.

The e2e test ships a code change (a new grid rule) to a running `dagster dev` by writing the file
and reloading the location over GraphQL, as the UI's Reload button does; run workers import this
module too, so they see the same code versions as the webserver.
"""

import json
import os
from pathlib import Path

import dagster as dg

import dagster_project.definitions as deployed

OVERRIDES_ENV = "SPEECHDATA_E2E_CODE_VERSIONS"


def _code_version_overrides() -> dict[str, str]:
    path = os.environ.get(OVERRIDES_ENV, "")
    return json.loads(Path(path).read_text()) if path and Path(path).exists() else {}


def _with_overrides(defs: dg.Definitions, overrides: dict[str, str]) -> dg.Definitions:
    if not overrides:
        return defs
    return defs.map_asset_specs(
        func=lambda spec: spec.replace_attributes(
            code_version=overrides.get(spec.key.to_user_string(), spec.code_version)
        )
    )


# Only one Definitions object may sit at module scope: the deployed one stays in its module.
defs = _with_overrides(deployed.defs, _code_version_overrides())
