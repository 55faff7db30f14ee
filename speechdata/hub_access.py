"""A model from the Hugging Face Hub is loaded only when the Hub answers or the model is cached.

Without this, a ``full``-profile step on a machine without Hub access (the default profile, so a
plain ``dagster asset materialize``) spends about a minute in ``huggingface_hub``'s retries and
timeouts and ends with ``OSError: We couldn't connect to 'https://huggingface.co'``, never naming
the model profile. :func:`hub_model_access` is called by every loader of a Hub model (the text
tokenizer, the encoders, the CTC aligner, the audio LID and QE models) before it calls
``from_pretrained``: one request to the Hub's endpoint per process, bounded by
:data:`PROBE_TIMEOUT_S` (name resolution included), then either the Hub (it answered), the local
Hugging Face cache (it did not, but the model is there: loaded with ``local_files_only``), or
:class:`HubUnreachable`, whose message names ``SPEECHDATA_PROFILE`` and the offline profiles.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request

from speechdata.profiles import PROFILE_ENV, PROFILES

HUB_PROFILES = ("full",)
"""The profiles whose models come from the Hub; every other profile of :data:`PROFILES` is offline."""

PROBE_TIMEOUT_S = 5.0
"""How long the one request to the Hub may take, name resolution included."""

FAILED_PROBE_KEPT_S = 60.0
"""A Hub that did not answer is asked again after this long (a long-lived GPU worker outlives a
network outage); one that answered is not asked again."""

_TRUE = {"1", "true", "yes", "on"}
_PROBES: dict[str, tuple[str | None, float]] = {}
"""Endpoint -> (why it did not answer, None when it did; when it was asked)."""
_PROBES_LOCK = threading.Lock()


class HubUnreachable(OSError):
    """The Hub cannot be reached (or offline mode is on) and the model is not in the local cache."""


def offline_profiles() -> tuple[str, ...]:
    return tuple(profile for profile in PROFILES if profile not in HUB_PROFILES)


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def offline_mode_reason() -> str | None:
    """Why the Hub must not be asked: ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``, else None."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if os.environ.get("TRANSFORMERS_OFFLINE", "").strip().lower() in _TRUE:
        return "TRANSFORMERS_OFFLINE is set"
    return None


def hub_unanswered_reason(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``endpoint`` gave no HTTP answer below 500 within ``timeout_s`` (one request, no retry), else None.

    Asked once per process and endpoint (a failure again after :data:`FAILED_PROBE_KEPT_S`): the next
    model of the step gets the same verdict at once.
    """
    with _PROBES_LOCK:
        known = _PROBES.get(endpoint)
        if known is None or (known[0] is not None and time.monotonic() - known[1] > FAILED_PROBE_KEPT_S):
            known = _PROBES[endpoint] = (_probe(endpoint, timeout_s), time.monotonic())
        return known[0]


def _probe(endpoint: str, timeout_s: float) -> str | None:
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            request = urllib.request.Request(endpoint.rstrip("/") + "/", method="HEAD")
            with urllib.request.urlopen(request, timeout=timeout_s):
                outcome.append(None)
        except urllib.error.HTTPError as error:
            outcome.append(None if error.code < 500 else f"HTTP {error.code}")
        except (OSError, ValueError) as error:
            outcome.append(f"{type(error).__name__}: {getattr(error, 'reason', None) or error}")

    # The socket timeout does not bound name resolution (a resolver without network can take tens of
    # seconds): the request runs in a thread and is given up on after timeout_s.
    thread = threading.Thread(target=ask, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        return f"no answer in {timeout_s:g} s"
    return outcome[0]


def in_local_cache(model_id: str, revision: str | None) -> bool:
    """The model's snapshot at ``revision`` is in the Hugging Face cache (read without network)."""
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(model_id, revision=revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - any miss (no folder, no ref, bad id) means "not cached"
        return False
    return True


def is_a_path(model_id: str) -> bool:
    """A file system path, never a Hub id (``name`` or ``org/name``)."""
    return os.path.isabs(model_id) or model_id.startswith((".", "~")) or model_id.count("/") > 1


def hub_model_access(model_id: str, revision: str | None = None, *, local_files_only: bool = False) -> bool:
    """The ``local_files_only`` to load ``model_id`` with; raises :class:`HubUnreachable` when it cannot load.

    A local folder (loaded with ``local_files_only``), a path that is not a Hub id (absolute,
    relative, ``~``, more than ``org/name``: ``from_pretrained`` names a missing one itself) or
    ``local_files_only=True`` asks nothing.
    """
    if local_files_only or os.path.isdir(model_id) or is_a_path(model_id):
        return True
    reason = offline_mode_reason()
    if reason is None:
        endpoint = hub_endpoint()
        unanswered = hub_unanswered_reason(endpoint)
        if unanswered is None:
            return False
        reason = f"{endpoint} did not answer ({unanswered})"
    if in_local_cache(model_id, revision):
        return True
    raise HubUnreachable(unreachable_message(model_id, revision, reason))


def unreachable_message(model_id: str, revision: str | None, reason: str) -> str:
    chosen = os.environ.get(PROFILE_ENV, "").strip()
    if not chosen:
        profile = f"{PROFILE_ENV} is unset, so the profile is 'full', which loads the production models from the Hub"
    elif chosen.lower() in HUB_PROFILES:
        profile = f"{PROFILE_ENV}={chosen} loads the production models from the Hub"
    else:
        profile = f"{PROFILE_ENV}={chosen}, but this model was configured by hand: 'full' models come from the Hub"
    offline = offline_profiles()
    at = f"@{revision}" if revision else ""
    return (
        f"model {model_id}{at} needs the Hugging Face Hub and is not in the local cache, but the Hub cannot be "
        f"used: {reason}. {profile}. Without Hub access, choose an offline profile: "
        f"{PROFILE_ENV}={' or '.join(offline)} (e.g. `{PROFILE_ENV}={offline[0]} dagster asset materialize ...`); "
        f"or download the model where the Hub is reachable (`hf download {model_id}`) into this machine's "
        "Hugging Face cache. See docs/models-and-profiles.md."
    )
