"""The one entry point: every asset, check, job, sensor and resource of the code location.

``dagster_project.loader`` assembles them from the asset group modules (found in ``assets``) and the
sensor modules; this module only holds the result, as Dagster's code location loader expects.
"""

from dagster_project.loader import build_definitions, build_resources  # noqa: F401 (build_resources: demo, tests)
from resources.catalog import catalog_database_path  # noqa: F401 (re-exported: tests)

defs = build_definitions()
