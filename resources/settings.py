"""What every resource factory is built from: the data root, the model profile, the model cache.

Each resource key is bound once, in ``dagster_project.loader.RESOURCE_FACTORIES``, to a factory: a
function of :class:`ResourceSettings` (defined beside its resource class). The code location's
loader calls each factory once per key, so two groups that need ``data_root`` share one resource.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speechdata.profiles import Profile


@dataclass(frozen=True)
class ResourceSettings:
    data_root_url: str
    profile: Profile
    model_cache_dir: str
    """Where locally built models (the tiny profile's, NeMo's save/restore) are kept."""


ResourceFactory = Callable[[ResourceSettings], Any]
