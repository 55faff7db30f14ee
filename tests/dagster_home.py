"""Opening a Dagster instance folder from a test process whose own DAGSTER_HOME is another one."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg


@contextmanager
def instance_at(home) -> Iterator[dg.DagsterInstance]:
    """The instance in ``home``: deploy/*/dagster.yaml name their storage as ``{env: DAGSTER_HOME}``,
    so the variable must point at ``home`` while the storage is opened (``make test`` exports its own)."""
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            yield instance
    finally:
        if previous is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = previous
