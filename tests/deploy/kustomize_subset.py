"""Render a kustomization offline: the small part of kustomize that deploy/k8s uses.

CI has neither kustomize nor a cluster, so this renders what ``kubectl apply -k`` would send,
for the features the manifests use and nothing more:

- ``resources``: YAML files (several documents each) and directories that hold a
  ``kustomization.yaml``, rendered recursively, in order;
- ``configMapGenerator``: ``name``, ``files`` (key = the file's name, or ``key=path``),
  ``behavior`` ``create`` or ``replace``, and ``options.disableNameSuffixHash: true``
  (name hashing is not implemented, so it must be switched off);
- ``images``: ``name`` with ``newName``, ``newTag`` and/or ``digest``, applied to the
  containers and init containers of every pod template rendered at or below that level
  (what ``kustomize edit set image`` writes).

A kustomization that uses anything else is an error here, so the manifests cannot drift
past what CI checks. Like kustomize, two objects with the same kind and name are an error,
and files must live under the kustomization's directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

_KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "images"}
_GENERATOR_KEYS = {"name", "files", "behavior", "options"}
_IMAGE_KEYS = {"name", "newName", "newTag", "digest"}


class KustomizeError(Exception):
    """The kustomization is outside the subset, or would not build with kustomize either."""


def render(directory: Path) -> list[Obj]:
    """The objects ``kustomize build directory`` would emit (order aside)."""
    directory = directory.resolve()
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - _KUSTOMIZATION_KEYS
    if unknown:
        raise KustomizeError(f"{directory}: unsupported kustomization keys {sorted(unknown)}")
    if spec.get("kind") != "Kustomization":
        raise KustomizeError(f"{directory}: kind must be Kustomization")
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects.extend(render(path))
        else:
            objects.extend(d for d in yaml.safe_load_all(_inside(directory, path).read_text()) if d)
    for generator in spec.get("configMapGenerator", []):
        _generate(directory, generator, objects)
    for image in spec.get("images", []):
        _set_image(directory, image, objects)
    _check_unique(directory, objects)
    return objects


def _set_image(directory: Path, image: Obj, objects: list[Obj]) -> None:
    unknown = set(image) - _IMAGE_KEYS
    if unknown or "name" not in image:
        raise KustomizeError(f"{directory}: unsupported images entry {image}")
    for obj in objects:
        template = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in template.get("containers", []) + template.get("initContainers", []):
            name, sep, tag = _split_image(container["image"])
            if name != image["name"]:
                continue
            name = image.get("newName", name)
            if "digest" in image:
                sep, tag = "@", image["digest"]
            elif "newTag" in image:
                sep, tag = ":", str(image["newTag"])
            container["image"] = f"{name}{sep}{tag}"


def _split_image(image: str) -> tuple[str, str, str]:
    """``name``, the separator (``:``, ``@`` or empty) and the tag or digest."""
    if "@" in image:
        name, _, digest = image.partition("@")
        return name, "@", digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], ":", image[colon + 1 :]
    return image, "", ""


def _generate(directory: Path, generator: Obj, objects: list[Obj]) -> None:
    unknown = set(generator) - _GENERATOR_KEYS
    if unknown:
        raise KustomizeError(f"{directory}: unsupported configMapGenerator keys {sorted(unknown)}")
    if generator.get("options") != {"disableNameSuffixHash": True}:
        raise KustomizeError(f"{directory}: configMapGenerator needs disableNameSuffixHash")
    data = {}
    for item in generator["files"]:
        key, _, name = item.partition("=") if "=" in item else (Path(item).name, "", item)
        data[key] = _inside(directory, directory / name).read_text()
    made: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": generator["name"]},
        "data": data,
    }
    behavior = generator.get("behavior", "create")
    existing = [i for i, o in enumerate(objects) if _id(o) == _id(made)]
    if behavior == "create":
        if existing:
            raise KustomizeError(f"{directory}: {_id(made)} exists; use behavior: replace")
        objects.append(made)
    elif behavior == "replace":
        if not existing:
            raise KustomizeError(f"{directory}: nothing to replace for {_id(made)}")
        objects[existing[0]] = made
    else:
        raise KustomizeError(f"{directory}: unsupported behavior {behavior!r}")


def _inside(root: Path, path: Path) -> Path:
    """kustomize's default load restriction: no files from outside the kustomization root."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise KustomizeError(f"{path} is outside {root}")
    return resolved


def _id(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _check_unique(directory: Path, objects: list[Obj]) -> None:
    seen: set[tuple[str, str]] = set()
    for obj in objects:
        if _id(obj) in seen:
            raise KustomizeError(f"{directory}: {_id(obj)} appears twice")
        seen.add(_id(obj))
