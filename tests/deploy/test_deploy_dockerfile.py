"""deploy/Dockerfile, checked statically (CI has no Docker engine): a pinned, non-dev install,
a non-root user, the settings' port, and an entrypoint that is a real console script."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# BuildKit reads <Dockerfile>.dockerignore next to the Dockerfile before the context's own.
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            result.append([])
        if result:
            result[-1].append((word, rest))
    return result


def final(word: str) -> list[str]:
    return [rest for w, rest in stages()[-1] if w == word]


def env(stage: list[tuple[str, str]]) -> dict[str, str]:
    values: dict[str, str] = {}
    for word, rest in stage:
        if word == "ENV":
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                values[name] = value
    return values


def test_multi_stage_on_python_311_slim() -> None:
    bases = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    assert len(bases) >= 2
    assert set(bases) == {"python:3.11-slim"}


def test_installs_the_package_with_the_pinned_constraints_and_no_dev_group() -> None:
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    (install,) = re.findall(r"pip install ([^&;]*)", runs)
    words = install.split()
    assert words[-1] == "."
    constraints = words[words.index("-c") + 1]
    # The constraints file handed to pip is made from the repository's constraints.txt.
    assert re.search(rf"constraints\.txt\s*>\s*{re.escape(constraints)}", runs)
    assert "--group" not in words and "-e" not in words and "--editable" not in words


def test_runs_as_a_numeric_non_root_user() -> None:
    (user,) = final("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_listens_on_every_interface_on_the_settings_default_port() -> None:
    port = Settings.model_fields["port"].default
    assert final("EXPOSE") == [str(port)]
    values = env(stages()[-1])
    assert values["SPECLANE_HOST"] == "0.0.0.0"
    assert values["SPECLANE_PORT"] == str(port)
    known = {f"SPECLANE_{name.upper()}" for name in Settings.model_fields}
    assert {k for k in values if k.startswith("SPECLANE_")} <= known


def test_workers_follow_the_containers_cpus_when_redis_is_set() -> None:
    assert env(stages()[-1])["SPECLANE_WORKERS"] == "auto"


def test_the_entrypoint_is_the_speclane_console_script_serving(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (entrypoint,) = final("ENTRYPOINT")
    script, *args = json.loads(entrypoint)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert script in scripts
    assert scripts[script] == "gateway.cli.main:main"
    with pytest.raises(SystemExit) as exited:
        main([*args, "--help"])
    assert exited.value.code == 0
    assert "--policy" in capsys.readouterr().out


def test_the_healthcheck_asks_healthz_with_python_alone() -> None:
    (check,) = final("HEALTHCHECK")
    command = json.loads(check.split("CMD", 1)[1])
    assert command[:2] == ["python", "-c"]
    assert "/healthz" in command[2]
    compile(command[2], "HEALTHCHECK", "exec")


def _ignored(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    ignored = False
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/").replace("**/", "")
        if fnmatch.fnmatch(path, pattern) or path.startswith(f"{pattern}/"):
            ignored = not negate
    return ignored


def test_everything_copied_from_the_context_exists_and_is_not_ignored() -> None:
    for word, rest in instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _ = rest.split()
        for source in sources:
            path = source.rstrip("/")
            assert (ROOT / path).exists(), source
            assert not _ignored(path), f"{source} is excluded by {DOCKERIGNORE.name}"
