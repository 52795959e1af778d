"""The tiny target and draft models, built once per set of builder parameters and cached.

The cache key is a hash of the parameters, the builder's own source and the Python that
runs it (its standard library is the training text), so a change to any of them builds a
new pair beside the old one. ``built.json`` is written last: a directory without it is a
build that did not finish, and is made again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from gateway.cli.localvllm.install import locked
from gateway.cli.localvllm.steps import run, step

BUILDER = Path(__file__).with_name("tinymodels.py")


@dataclass(frozen=True, slots=True)
class ModelParams:
    """The builder's options (see ``tinymodels.py``)."""

    seed: int = 0
    train_steps: int = 60
    distill_steps: int = 30
    dtype: str = "bfloat16"

    def argv(self) -> list[str]:
        return [f"--{name.replace('_', '-')}={value}" for name, value in asdict(self).items()]


DEFAULT_PARAMS = ModelParams()


@dataclass(frozen=True, slots=True)
class Models:
    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    @property
    def report(self) -> dict[str, object]:
        loaded: dict[str, object] = json.loads((self.root / "built.json").read_text())
        return loaded


def models_path(cache: Path, python: Path, params: ModelParams) -> Path:
    version = subprocess.check_output(
        [str(python), "-c", "import sys; print(sys.version)"], text=True
    )
    key = hashlib.sha256()
    key.update(json.dumps(asdict(params), sort_keys=True).encode())
    key.update(BUILDER.read_bytes())
    key.update(version.encode())
    return cache / "tiny-models" / key.hexdigest()[:16]


def ensure(cache: Path, python: Path, params: ModelParams, log: Path) -> Models:
    """The model pair for ``params``, built with the vLLM venv's ``python`` unless cached."""
    models = Models(models_path(cache, python, params))
    with locked(models.root.with_name(models.root.name + ".lock")):
        if not (models.root / "built.json").exists():
            if models.root.exists():
                shutil.rmtree(models.root)
            with step(f"building tiny models into {models.root} (log: {log})"):
                run([python, BUILDER, "--out", models.root, *params.argv()], log)
    return models
