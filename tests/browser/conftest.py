"""The browser tier: Playwright's async API driving the system's headless Chromium.

Without Chromium or Playwright the tests skip with the reason, except under ``CI=true``,
where they fail: a CI run must not pass without having opened the console once.
``SPECLANE_SCREENSHOTS=DIR`` saves the screenshots the tests take (``make screenshots``
writes them to ``docs/console/`` for the README).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tier: {reason}")
    pytest.skip(f"browser tier: {reason}")


def chromium_path() -> str:
    for name in (os.environ.get("SPECLANE_CHROMIUM"), "chromium", "chromium-browser"):
        found = name and shutil.which(name)
        if found:
            return found
    _unavailable("no chromium on PATH (make browser installs Debian's package)")
    raise AssertionError("unreachable")


@asynccontextmanager
async def chromium(viewport: dict[str, int]) -> AsyncIterator[Any]:
    """A fresh headless Chromium with its own profile, closed afterwards."""
    executable = chromium_path()
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        _unavailable("playwright is not installed (make browser installs it)")
    with tempfile.TemporaryDirectory(prefix="speclane-chromium-") as profile:
        async with async_playwright() as p:
            context = await p.chromium.launch_persistent_context(
                profile, executable_path=executable, args=FLAGS, headless=True, viewport=viewport
            )
            try:
                yield context
            finally:
                await context.close()


def screenshot_dir() -> Path | None:
    folder = os.environ.get("SPECLANE_SCREENSHOTS")
    if not folder:
        return None
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
