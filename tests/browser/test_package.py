"""``pip install`` users get the console: the wheel carries every file of its static page."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).parents[2]
STATIC = ROOT / "gateway" / "server" / "console" / "static"


def test_the_wheel_carries_the_console(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("speclane-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"gateway/server/console/static/{p.name}" for p in STATIC.iterdir()}
    assert shipped and shipped <= names
