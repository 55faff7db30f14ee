"""Model profiles: ``full`` loads the production models, ``tiny`` builds small local ones.

``tiny`` is for the demo, tests and CI (no network to model hubs): same model classes and code
paths, randomly initialised weights. Chosen by ``SPEECHDATA_PROFILE``.
"""

from __future__ import annotations

import os
from typing import Literal

Profile = Literal["tiny", "full"]
PROFILES: tuple[Profile, ...] = ("tiny", "full")
PROFILE_ENV = "SPEECHDATA_PROFILE"
DEFAULT_PROFILE: Profile = "full"


def profile_from_env(environ: dict[str, str] | None = None) -> Profile:
    value = (environ if environ is not None else os.environ).get(PROFILE_ENV, DEFAULT_PROFILE).strip().lower()
    if value not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={value!r} is not a profile; use one of {', '.join(PROFILES)}")
    return value  # type: ignore[return-value]
