"""Where a JSON schema's local `$ref`s lead: a function's parameters embedded in the calls' schema keep their refs
pointing into themselves (`rooted`), and a chain of refs that only comes back to itself is found before llguidance
takes it (`ref_cycle`)."""

from __future__ import annotations

from typing import Any

__all__ = ["rooted", "ref_cycle"]


# Keywords whose value maps names to subschemas (a property may be called "const"), and those whose value is data (a
# "$ref" inside a const is a value to match, not a reference).
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_DATA = frozenset({"const", "enum", "default", "examples"})


def rooted(schema: Any, at: str) -> Any:
    """A copy of a function's `schema` whose local `$ref`s ("#", "#/$defs/X", any JSON pointer) point at where it sits
    in the calls' schema (`at`, a JSON pointer): embedded there, they resolved against the calls' root (Pydantic's
    nested models). A subschema with its own `$id` is its own resource, its refs resolved against it: left as it is,
    as are refs that are not pointers (URLs, anchors). Raises nothing."""
    if isinstance(schema, list):
        return [rooted(item, at) for item in schema]
    if not isinstance(schema, dict) or isinstance(schema.get("$id"), str):
        return schema
    copy: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            copy[key] = f"#{at}{value[1:]}"
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            copy[key] = {name: rooted(sub, at) for name, sub in value.items()}
        else:
            copy[key] = value if key in _DATA else rooted(value, at)
    return copy


# Keywords that describe a schema without constraining it: a node with only these beside `$ref` is that ref alone.
_ANNOTATIONS = frozenset({"$ref", "title", "description", "$comment", "default", "examples", "deprecated"})


def ref_cycle(schema: Any) -> str | None:
    """The first local `$ref` (in `schema`'s own pointers) whose chain of refs comes back to itself without reaching a
    schema ({"$ref": "#"} alone, $defs A → A): llguidance takes such a schema, and it constrains nothing, or fails
    mid-reply. None when there is none. Raises nothing."""
    def target(pointer: str) -> Any:
        node: Any = schema
        for part in pointer[2:].split("/") if pointer != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def only_ref(node: Any) -> str | None:
        ref = node.get("$ref") if isinstance(node, dict) else None
        local = isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))
        return ref if local and set(node) <= _ANNOTATIONS else None

    stack, seen_nodes = [schema], 0
    while stack and seen_nodes < 100_000:  # bounded: a schema is already bounded by the body's size
        node = stack.pop()
        seen_nodes += 1
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict) or isinstance(node.get("$id"), str):
            continue
        ref, chain = only_ref(node), set()
        while ref is not None and ref not in chain:
            chain.add(ref)
            ref = only_ref(target(ref))
        if ref is not None:
            return ref
        stack.extend(v for k, v in node.items() if k not in _DATA)
    return None
