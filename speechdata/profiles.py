"""Model profiles: ``full`` loads the production models, ``tiny`` builds small local ones.

``tiny`` is for tests and CI (no network to model hubs): same model classes and code paths,
randomly initialised weights. ``small`` is ``tiny`` with one trained model: the CTC aligner of
English and German trained here on synthesized speech, committed in the package
(docs/models-and-profiles.md); the demo runs it. Chosen by ``SPEECHDATA_PROFILE`` once, in the
code location's settings, and passed from there to the resources and the code versions.
"""

from __future__ import annotations

import os
from typing import Literal

Profile = Literal["tiny", "small", "full"]
PROFILES: tuple[Profile, ...] = ("tiny", "small", "full")
PROFILE_ENV = "SPEECHDATA_PROFILE"
DEFAULT_PROFILE: Profile = "full"


SMALL_ALIGNER_LANGUAGES = ("en", "de")
"""The languages the ``small`` profile's trained aligner was trained on (its other languages keep ``tiny``'s)."""


def runs_tiny_models(profile: Profile) -> bool:
    """Whether the profile's models other than the aligner are the tiny, random stand-ins."""
    return profile != "full"


def check_profile(value: str) -> Profile:
    if value not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={value!r} is not a profile; use one of {', '.join(PROFILES)}")
    return value  # type: ignore[return-value]


def profile_from_env(environ: dict[str, str] | None = None) -> Profile:
    return check_profile(
        (environ if environ is not None else os.environ).get(PROFILE_ENV, DEFAULT_PROFILE).strip().lower()
    )


TINY_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speech data needs exact alignment between audio and text. "
    "Every utterance is accounted for, packed or rejected with a reason. We met at twenty past two. "
    "Please call Stella and ask her to bring these things with her from the store. "
    "Guten Morgen, wie geht es dir heute? Die Katze schläft auf dem warmen Sofa. "
    "Bonjour, je voudrais un café, s'il vous plaît. Le train pour Paris part à huit heures. "
    "El cielo está despejado y hace mucho sol. 0123456789"
)
"""The text the tiny profile's tokenizers and tiny CTC model are trained on (deterministic, in-repo)."""
