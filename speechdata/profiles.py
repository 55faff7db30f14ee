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


TINY_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speech data needs exact alignment between audio and text. "
    "Every utterance is accounted for, packed or rejected with a reason. We met at twenty past two. "
    "Please call Stella and ask her to bring these things with her from the store. "
    "Guten Morgen, wie geht es dir heute? Die Katze schläft auf dem warmen Sofa. "
    "Bonjour, je voudrais un café, s'il vous plaît. Le train pour Paris part à huit heures. "
    "El cielo está despejado y hace mucho sol. 0123456789"
)
"""The text the tiny profile's tokenizers and tiny CTC model are trained on (deterministic, in-repo)."""
