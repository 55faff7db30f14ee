"""Alias of ``speechdata catalog`` (:mod:`speechdata.catalog.cli`), kept for ``python -m dagster_project.catalog``."""

import sys

from speechdata.catalog.cli import main, open_catalog, refresh  # noqa: F401 (re-exported)

if __name__ == "__main__":
    sys.exit(main())
