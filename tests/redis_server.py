"""Redis for tests: the machine's server on 127.0.0.1:6379, or a private one we can kill.

Tests that need Redis fail when it is missing and CI is set (CI=true), and skip otherwise.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.servers import free_port

SHARED = "redis://127.0.0.1:6379/0"


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            answer = s.recv(64)
            return answer.startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def require_shared_redis() -> str:
    if not _reachable(6379):
        if os.environ.get("CI"):
            pytest.fail("Redis is required on 127.0.0.1:6379 in CI")
        pytest.skip("no Redis on 127.0.0.1:6379")
    return SHARED


def namespace() -> str:
    return f"speclane-test-{uuid.uuid4().hex[:10]}"


class PrivateRedis:
    """A redis-server of our own on a free port, started and stopped at will."""

    def __init__(self, password: str | None = None) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.password = password
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            if os.environ.get("CI"):
                pytest.fail("redis-server is required in CI")
            pytest.skip("redis-server is not installed")
        self._process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while not _reachable(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError("private redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


@contextmanager
def private_redis(password: str | None = None) -> Iterator[PrivateRedis]:
    server = PrivateRedis(password)
    server.start()
    try:
        yield server
    finally:
        server.stop()
