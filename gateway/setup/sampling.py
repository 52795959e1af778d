"""The temperature the served model samples at when a request sets none, for ``speclane init``.

vLLM (``--generation-config auto``, its default) applies the sampling fields of the model's
``generation_config.json`` to every request that leaves them out, and 1.0 where the file sets
none; no page of the server shows them. ``/v1/models`` shows where the model came from (each
card's ``root``: vLLM's ``--model``, a directory or a Hugging Face id), so the file is read
from that directory, or from the Hugging Face cache on this machine. Anything else is
decided by the operator (``--default-temperature``, or a question on a terminal). File reads
only; no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.setup import facts

VLLM_DEFAULT = 1.0  # what vLLM samples at when neither the request nor the model says


@dataclass(frozen=True, slots=True)
class Sampling:
    """The served model's defaults, and where they came from (said in the policy file)."""

    temperature: float
    top_p: float | None
    source: str
    decide: bool = False  # found nowhere: written, and marked for the operator to decide


def from_files(root: str, hub_cache: Path) -> Sampling | None:
    """The defaults in the ``generation_config.json`` of ``root``, or None when no file is
    found on this machine."""
    for path in _candidates(root, hub_cache):
        try:
            found = facts.generation_config(path.read_bytes())
        except OSError:
            continue
        temperature = found.get("temperature")
        if temperature is None:
            source = f"{path} sets none: vLLM's own default"
            return Sampling(VLLM_DEFAULT, found.get("top_p"), source)
        return Sampling(temperature, found.get("top_p"), str(path))
    return None


def _candidates(root: str, hub_cache: Path) -> list[Path]:
    if not root:
        return []
    local = Path(root).expanduser()
    if local.is_dir():
        return [local / "generation_config.json"]
    if root.count("/") != 1 or root.startswith(("/", ".", "~")):
        return []
    snapshots = hub_cache / f"models--{root.replace('/', '--')}" / "snapshots"
    return sorted(snapshots.glob("*/generation_config.json"), key=_newest, reverse=True)


def _newest(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def given(temperature: float, how: str) -> Sampling:
    return Sampling(temperature, None, how)


def unknown(root: str) -> Sampling:
    where = f"{root}/generation_config.json" if root else "the model's generation_config.json"
    return Sampling(
        VLLM_DEFAULT,
        None,
        f"{where} was not found here; {VLLM_DEFAULT:g} is vLLM's own default",
        decide=True,
    )


def parse_temperature(text: str) -> float:
    """A temperature as the policy takes it (0 to 2); ``ValueError`` says why not."""
    value = float(text)
    if not 0 <= value <= 2:
        raise ValueError(f"{text}: a temperature is 0 to 2")
    return value
