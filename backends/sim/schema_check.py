"""Whether a JSON schema can become a grammar, roughly as vLLM's structured-output backends
judge it: every ``type`` a JSON type, ``properties`` an object of schemas, ``items`` a schema,
``required`` a list of names, ``enum`` a non-empty list. The simulator uses it to fail a
request the way vLLM does when its grammar backend refuses the schema.

``never_ends`` finds what vLLM 0.32 lets through and then cannot run: a schema that is a
chain of local ``$ref`` coming back on itself (``{"$ref": "#/$defs/n", "$defs": {"n":
{"$ref": "#/$defs/n"}}}``) describes no value at all; xgrammar compiles it, and the engine
kills the request at its first token, answering 500 ``InternalServerError``.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

_TYPES = frozenset(("object", "array", "string", "number", "integer", "boolean", "null"))
_MAX_DEPTH = 32


def schema_problem(schema: object, where: str = "", depth: int = 0) -> str | None:
    """What is wrong with ``schema``, or ``None`` when a grammar can be built from it."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, Mapping):
        return f"a schema must be an object or a boolean at '{where or '/'}'"
    if depth > _MAX_DEPTH:
        return f"the schema nests deeper than {_MAX_DEPTH} levels at '{where}'"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for one in kinds:
        if one not in _TYPES:
            return f"Invalid type: {one}"  # llguidance's words
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        return f"'required' must be a list of property names at '{where or '/'}'"
    enum = schema.get("enum")
    if enum is not None and not (isinstance(enum, list) and enum):
        return f"'enum' must be a non-empty list at '{where or '/'}'"
    return _children(schema, where, depth)


def _children(schema: Mapping[str, object], where: str, depth: int) -> str | None:
    properties = schema.get("properties")
    if properties is not None:
        if not isinstance(properties, Mapping):
            return f"'properties' must be an object at '{where or '/'}'"
        for name, sub in properties.items():
            problem = schema_problem(sub, f"{where}/properties/{name}", depth + 1)
            if problem:
                return problem
    if "items" in schema:
        return schema_problem(schema["items"], f"{where}/items", depth + 1)
    return None


# the keys beside ``$ref`` that constrain nothing
_ANNOTATIONS = frozenset(("$ref", "$defs", "definitions", "$schema", "$id", "title", "description"))


def never_ends(schema: object) -> bool:
    """Whether ``schema`` is a chain of local ``$ref`` (each node nothing but a reference)
    that comes back to a node it passed: no value matches it."""
    seen: set[str] = set()
    node = schema
    while isinstance(node, Mapping) and isinstance(ref := node.get("$ref"), str):
        if not _ANNOTATIONS.issuperset(node) or ref in seen:
            return ref in seen
        seen.add(ref)
        node = _pointed(schema, ref)
    return False


def _pointed(root: object, ref: str) -> object:
    """The node a local ``$ref`` (``#`` or ``#/a/b``) names in ``root``; None if none."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        key = part.replace("~1", "/").replace("~0", "~")
        node = node.get(key) if isinstance(node, Mapping) else None
    return node
