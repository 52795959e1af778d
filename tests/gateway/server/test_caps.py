"""The default caps on connections, from the process's file limit (``RLIMIT_NOFILE``)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from gateway.server.connections import ConnectionLimits
from gateway.settings import RESERVED_FILES, Settings, client_cap, upstream_cap


@pytest.mark.parametrize(("files", "upstream", "clients"), [(1024, 240, 360), (65536, 1024, 32224)])
def test_the_documented_caps(files, upstream, clients):
    assert upstream_cap(files) == upstream
    assert client_cap(files, upstream) == clients


@pytest.mark.parametrize("files", [256, 1024, 4096, 20000, 65536, 1 << 20])
def test_the_caps_leave_descriptors_for_everything_else(files):
    """Client and upstream connections together take at most what the reserve leaves, and
    as much again stays free for connections being turned away."""
    upstream = upstream_cap(files)
    clients = client_cap(files, upstream)
    lingering = ConnectionLimits.of(Settings(max_connections=clients)).max_lingering
    assert 2 * clients + upstream + RESERVED_FILES <= files + 1
    assert lingering < clients


def test_set_caps_win():
    settings = Settings(max_connections=200, upstream_max_connections=50)
    assert (settings.client_connections, settings.upstream_connections) == (200, 50)
    assert settings.connections_per_peer == 100


def test_a_process_with_fewer_files_gets_smaller_caps():
    """A gateway started under ``ulimit -n 512`` caps its connections to fit in it."""
    code = (
        "from gateway.settings import Settings; s = Settings(); "
        "print(s.client_connections, s.upstream_connections, s.connections_per_peer)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}

    def limited() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    out = subprocess.run(
        [sys.executable, "-c", code], env=env, preexec_fn=limited, capture_output=True, check=True
    ).stdout.split()
    assert [int(x) for x in out] == [168, 112, 84]
