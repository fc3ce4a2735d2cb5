"""JSON output (`response_format` / the Responses API's `text.format`): the schema asked for, as a grammar the
engine's sampler follows (engine/constraints.py), from the reply's first token or after its thinking block."""

from __future__ import annotations

from typing import Any, Sequence

import anyio

from engine.constraints import ConstraintError, json_grammar
from engine.contracts import GrammarSpec
from service.http.errors import APIError

__all__ = ["check_response_format", "output_grammar"]

_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


def check_response_format(value: Any) -> dict[str, Any] | None:
    """`value` checked as OpenAI's response_format: text, json_object, or json_schema with a name and an object
    schema. Returns it. Raises ValueError saying what is wrong (a pydantic validator's message)."""
    if value is None or value == {"type": "text"}:
        return value
    if not isinstance(value, dict):
        raise ValueError('must be an object: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                         '"json_schema": {...}}')
    kind = value.get("type")
    if kind == "json_object":
        if set(value) != {"type"}:
            raise ValueError(f"json_object takes no other field ({', '.join(sorted(set(value) - {'type'}))})")
        return value
    if kind != "json_schema":
        raise ValueError(f'type {kind!r} is not one of "text", "json_object", "json_schema"')
    if set(value) != {"type", "json_schema"}:
        raise ValueError('json_schema needs its "json_schema" object, and no other field')
    spec = value["json_schema"]
    if not isinstance(spec, dict):
        raise ValueError("json_schema.json_schema must be an object")
    if unknown := sorted(set(spec) - _SCHEMA_KEYS):
        raise ValueError(f"json_schema has no field {', '.join(unknown)} (it takes {', '.join(sorted(_SCHEMA_KEYS))})")
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ValueError("json_schema.name is required: a string of 1 to 64 characters")
    if spec.get("schema") is not None and not isinstance(spec["schema"], dict):
        raise ValueError("json_schema.schema must be a JSON Schema object")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise ValueError("json_schema.strict must be a boolean")
    return value


def _schema(response_format: dict[str, Any]) -> dict[str, Any] | None:
    if response_format["type"] == "json_object":
        return None
    return response_format["json_schema"].get("schema") or {}


async def output_grammar(response_format: dict[str, Any] | None, *, tokenizer: Any, opens_thinking: bool,
                         calls: bool, param: str, json_calls: bool = False) -> GrammarSpec | None:
    """The grammar for a response_format (None for text): from the reply's first token, or after the thinking block
    it opens in (a harmony model: in its final channel). Beside tools the model may call, the tool-call marker may
    open the reply instead, which frees the rest (the call). Compiled in a worker thread: a large schema takes a
    while (`json_calls`: the tools were described in the prompt, calls are <tool_call> JSON). Raises APIError 400
    naming `param` for a schema that cannot be enforced, or tools whose calls open with more than one token (a call
    could not be told from the JSON)."""
    if response_format is None or response_format.get("type") == "text":
        return None
    harmony = _is_harmony(tokenizer)
    escape = None
    if calls and not harmony:  # harmony's calls go to another channel than the final one
        if (escape := _call_marker(tokenizer, json_calls)) is None:
            raise APIError(400, "JSON output beside tools is not offered for this model: its tool calls do not open "
                                "with one special token, so a call could not be told from the answer (send "
                                "tool_choice \"none\", or leave the tools out)", param=param, code="unsupported_value")
    try:
        grammar = await anyio.to_thread.run_sync(json_grammar, _schema(response_format))
    except ConstraintError as exc:
        raise APIError(400, str(exc), param=param, code="invalid_value") from None
    return GrammarSpec(grammar, after=_opening_marker(tokenizer, opens_thinking, harmony), escape=escape)


def _is_harmony(tokenizer: Any) -> bool:
    from engine.harmony import is_harmony

    return is_harmony(tokenizer)


def _call_marker(tokenizer: Any, json_calls: bool) -> int | None:
    """The one token that opens the model's tool calls, None when they open otherwise (bare JSON, several
    tokens). Raises nothing."""
    from engine.chat_output import OutputMarkers

    markers = OutputMarkers.from_tokenizer(tokenizer)
    start = (markers.with_json_tool_calls() if json_calls else markers).tool_call_start
    ids = list(_encode(tokenizer, start)) if start else []
    return ids[0] if len(ids) == 1 else None


def _opening_marker(tokenizer: Any, opens_thinking: bool, harmony: bool) -> tuple[int, ...]:
    if harmony:
        marker = "<|channel|>final<|message|>"  # the answer's channel; analysis (thinking) comes before it
    elif opens_thinking and (end := getattr(tokenizer, "think_end", None)):
        marker = end
    else:
        return ()
    return tuple(_encode(tokenizer, marker))


def _encode(tokenizer: Any, text: str) -> Sequence[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))
