"""The real-vLLM tier: ``speclane local-vllm up`` once per session, real ``speclane serve``
processes in front of it.

The stack comes up in a temporary run directory and goes down at the end; with
``SPECLANE_TEST_VLLM_RUN_DIR`` set, that run directory's stack is used (started or
completed by the same ``up``, which reuses running servers) and left running. When the
stack cannot be brought up the tier fails in CI (``CI=true``) and skips elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.localvllm.stackfile import StackState

_COLD_START_S = 1800  # install (~3 min), models, start (1-2 min), on a loaded 2-core machine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test on the stack brings it up, so it gets the time a cold start may take."""
    for item in items:
        if "stack_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(_COLD_START_S))
            return


def speclane(*args: str | Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``speclane ARGS`` as a user would, in a child process."""
    argv = [sys.executable, "-m", "gateway", *(str(a) for a in args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def bring_up(run_dir: Path) -> StackState:
    """``speclane local-vllm up`` for ``run_dir``, its progress passed on line by line."""
    argv = [sys.executable, "-m", "gateway", "local-vllm", "up", "--run-dir", str(run_dir)]
    said: list[str] = []
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        for line in process.stderr:
            sys.stderr.write(line)
            said = [*said[-40:], line]
    state = StackState.load(run_dir)
    if process.returncode != 0 or state is None:
        unavailable(f"`speclane local-vllm up` failed ({process.returncode}):\n{''.join(said)}")
    assert state is not None
    return state


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the real-vLLM stack is required in CI: {reason}", pytrace=False)
    pytest.skip(f"no real-vLLM stack: {reason}")


@pytest.fixture(scope="session")
def stack_dir(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[Path]:
    given = os.environ.get("SPECLANE_TEST_VLLM_RUN_DIR")
    run_dir = Path(given) if given else tmp_path_factory.mktemp("local-vllm")
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():  # show the start-up's progress as it happens
        bring_up(run_dir)
    yield run_dir
    if not given:
        speclane("local-vllm", "down", "--run-dir", run_dir, timeout=120)


@pytest.fixture
def stack(stack_dir: Path) -> StackState:
    """The stack as its state file says now (a test may have restarted a server)."""
    state = StackState.load(stack_dir)
    assert state is not None
    return state
