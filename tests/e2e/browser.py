"""Debian's Chromium, headless, driven by Playwright: no browser is ever downloaded."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = Path(os.environ.get("SPEECHDATA_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1600, "height": 1000}


@contextlib.contextmanager
def chromium_page() -> Iterator:
    """A page in a fresh Chromium profile (Playwright takes the profile directory itself rather
    than a ``--user-data-dir`` argument), closed with its browser on exit."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=VIEWPORT,
        )
        try:
            yield context.new_page()
        finally:
            context.close()
