"""Constrained replies: JSON output (`response_format` / the Responses API's `text.format`; TGI's `json` and `regex`
grammars too), vLLM's structured outputs (service/chat/structured_outputs.py) and strict function calls (`strict:
true`), as the grammar the engine's sampler follows (engine/constraints.py): the answer from its first token or after
its thinking block, a call's arguments from its opening marker."""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any, Callable, NamedTuple, Sequence

import anyio

from engine.chat_output import OutputMarkers
from engine.constraints import (CallFunction, ConstraintError, ParametersError, call_grammar, json_grammar,
                                marker, regex_grammar)
from engine.contracts import GrammarSpec
from engine.harmony import is_harmony
from service.chat.structured_outputs import AskedConstraint
from service.http.errors import APIError

__all__ = ["check_response_format", "reply_grammar"]

_log = logging.getLogger("tandem.service")

_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


def check_response_format(value: Any) -> dict[str, Any] | None:
    """`value` checked as OpenAI's response_format: text, json_object, or json_schema with a name and an object
    schema; or as TGI's grammar (`_tgi_format`). Returns it (a TGI schema sent as JSON text, parsed). Raises ValueError
    saying what is wrong (a pydantic validator's message)."""
    if value is None or value == {"type": "text"}:
        return value
    if not isinstance(value, dict):
        raise ValueError('must be an object: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                         '"json_schema": {...}}')
    kind = value.get("type")
    if kind in ("json", "regex") or (kind == "json_object" and value.get("value") is not None):
        return _tgi_format(value)
    if kind == "json_object":
        if other := sorted(set(value) - {"type", "value"}):
            raise ValueError(f"json_object takes no other field than a schema in value ({', '.join(other)})")
        return {"type": "json_object"}
    if kind != "json_schema":
        raise ValueError(f'type {kind!r} is not one of "text", "json_object", "json_schema" (or TGI\'s "json", '
                         '"regex")')
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


def _tgi_format(value: dict[str, Any]) -> dict[str, Any]:
    """TGI's grammar (its GrammarType, as huggingface_hub's InferenceClient rewrites OpenAI's json_schema to it):
    `json`, or its alias `json_object`, with a JSON Schema in `value` (an object, or TGI's JSON text of one); `regex`
    with a pattern the whole reply matches. Raises ValueError saying what is wrong."""
    kind = value["type"]
    if other := sorted(set(value) - {"type", "value"}):
        raise ValueError(f"{kind} takes only value ({', '.join(other)})")
    given = value.get("value")
    if kind == "regex":
        if not isinstance(given, str):
            raise ValueError("regex's value must be the pattern, a string")
        return value
    if isinstance(given, str):
        try:
            given = json.loads(given)
        except ValueError:
            raise ValueError(f"{kind}'s value is text that is not JSON: send the JSON Schema as an object") from None
    if not isinstance(given, dict):
        raise ValueError(f"{kind}'s value must be a JSON Schema object")
    return {"type": kind, "value": given}


# How an error names the answer's grammar, by whether response_format asked for it (else vLLM's fields did).
_WHAT = {False: "Structured output", True: "JSON output"}


def _schema(response_format: dict[str, Any]) -> dict[str, Any] | None:
    if "value" in response_format:  # TGI's json
        return dict(response_format["value"])
    if response_format["type"] == "json_object":
        return None
    # No schema at all (a client that names its format only): an object, as json_object; a bare string came back.
    return response_format["json_schema"].get("schema")


def _compile(response_format: dict[str, Any]) -> str:
    """The answer's grammar: a schema marked strict exactly (an unimplemented keyword refused, as OpenAI's strict mode
    refuses it), otherwise leniently (such keywords ignored, the rest enforced, TGI's schemas too); TGI's regex matched
    whole. Raises ConstraintError."""
    if response_format["type"] == "regex":
        return regex_grammar(response_format["value"])
    strict = response_format["type"] == "json_schema" and response_format["json_schema"].get("strict") is True
    return json_grammar(_schema(response_format), lenient=not strict)


class _Markers(NamedTuple):
    """The model's tool-call markers with their tokens, and whether its calls are <tool_call> JSON (mlx-lm's
    json_tools format, the one strict calls are written in)."""

    opening: str
    opening_ids: list[int]
    closing: str
    closing_ids: list[int]
    json_format: bool


async def reply_grammar(response_format: dict[str, Any] | None, tools: list[dict[str, Any]] | None, *,
                        tokenizer: Any, opens_thinking: bool, calls: bool, json_calls: bool = False,
                        prepare: Callable[[GrammarSpec], None] | None = None, forced: str | bool = False,
                        asked: AskedConstraint | None = None) -> GrammarSpec | None:
    """What the reply must follow (None: nothing). The answer follows the response_format's schema (or pattern), or
    the constraint vLLM's fields ask for (`asked`, service/chat/structured_outputs.py), from its first token, or after
    the thinking block it opens in (a harmony model: in its final channel); beside tools the model may call, its
    one-token call marker may open the reply instead. A call's arguments follow their function's
    parameters where any tool is `strict` (calls written as <tool_call> JSON; `json_calls`: the tools were told in
    the prompt), and a forced call (`forced`: tool_choice "required", True, or the function's name) is the reply.
    Grammars are compiled, and their matchers built (`prepare`, the engine's), in worker threads: llguidance built a
    large schema's lexer in seconds on the event loop. Raises APIError 400 naming the field for a schema that cannot
    be enforced, JSON beside tools whose calls open with more than one token, or strict or forced calls of a model
    whose calls are written otherwise."""
    harmony = is_harmony(tokenizer)
    markers = _call_markers(tokenizer, json_calls) if calls and not harmony else None
    if forced and calls:
        if markers is None or not markers.json_format:
            raise APIError(400, "a forced tool call is offered for models whose calls are <tool_call> JSON (Hermes, "
                                "Qwen 2.5 and 3, SmolLM3, and models told their tools in the prompt), not for this "
                                "model's format; use \"auto\"", param="tool_choice", code="unsupported_value")
        chosen = [t for t in tools or () if forced is True or t["function"]["name"] == forced]
        # The grammar writes the opening marker itself, so one of several tokens serves too.
        grammar = await _calls_grammar(chosen, markers, prepare, param="tools", opened=False,
                                       indexes=[i for i, t in enumerate(tools or ()) if any(t is c for c in chosen)])
        after = _opening_marker(tokenizer, opens_thinking, False, what="A forced tool call", param="tool_choice")
        return GrammarSpec(None, after=after, calls=grammar)
    answer = asks_answer(response_format, asked)
    field = asked.param if asked is not None else "response_format"  # the field asking for the answer's grammar
    strict = [i for i, tool in enumerate(tools or ()) if tool.get("function", {}).get("strict")] if calls else []
    if not answer and not strict:
        return None
    if strict and (markers is None or not markers.json_format):
        raise APIError(400, "strict function calling is offered for models whose calls are <tool_call> JSON (Hermes, "
                            "Qwen 2.5 and 3, SmolLM3, models told their tools in the prompt), not for this model's "
                            "format; send strict: false", param=f"tools.{strict[0]}.function.strict",
                       code="unsupported_value")
    # A marker of several tokens (written as text, which may merge with what precedes it) is found in the text by the
    # calls' grammar itself, from the first token.
    text_marker = markers is not None and len(markers.opening_ids) != 1
    escape = None
    if answer and calls and not harmony:  # harmony's calls go to another channel than the final one
        if markers is None or text_marker:
            raise APIError(400, f"{_WHAT[asked is None]} beside tools is not offered for this model: its tool calls "
                                "do not open with one special token, so a call could not be told from the answer "
                                "(send tool_choice \"none\", or leave the tools out)", param=field,
                           code="unsupported_value")
        escape = markers.opening_ids[0]
    text = await answer_grammar(response_format, asked, prepare) if answer else None
    call_text = None
    if strict and markers is not None and tools:
        call_text = await _calls_grammar(tools, markers, prepare, param=f"tools.{strict[0]}.function.parameters",
                                         free_text=markers.opening if text_marker else None)
    if text is None:  # only the calls: free text until a call opens (told by its token, or by the grammar)
        assert markers is not None
        return GrammarSpec(None, after=() if text_marker else tuple(markers.opening_ids), calls=call_text)
    return GrammarSpec(text, after=_opening_marker(tokenizer, opens_thinking, harmony, what=_WHAT[asked is None],
                                                   param=field), escape=escape,
                       calls=call_text, think=None if opens_thinking or harmony else _think_tokens(tokenizer))


def asks_answer(response_format: dict[str, Any] | None, asked: AskedConstraint | None) -> bool:
    """Whether the answer follows a grammar: vLLM's fields ask for one, or a response_format other than text. Raises
    nothing."""
    return asked is not None or (response_format is not None and response_format.get("type") != "text")


async def answer_grammar(response_format: dict[str, Any] | None, asked: AskedConstraint | None,
                         prepare: Callable[[GrammarSpec], None] | None) -> str:
    """The answer's grammar: `asked`'s (vLLM's fields), else the response_format's (`asks_answer`); compiled, and its
    matcher built (`prepare`), in worker threads. Raises APIError 400 naming the field for what cannot be enforced."""
    compile_answer = asked.grammar if asked is not None else partial(_compile, response_format or {})
    try:
        text = await anyio.to_thread.run_sync(compile_answer)
        if prepare is not None:
            await anyio.to_thread.run_sync(prepare, GrammarSpec(text))
    except ConstraintError as exc:  # TGI's grammar: its schema or pattern is `value`
        param = asked.param if asked is not None else \
            "response_format.value" if "value" in (response_format or {}) else "response_format"
        raise APIError(400, str(exc), param=param, code="invalid_value") from None
    return text


async def _calls_grammar(tools: list[dict[str, Any]], markers: _Markers, prepare: Callable[[GrammarSpec], None] | None,
                         *, param: str, opened: bool = True, free_text: str | None = None,
                         indexes: Sequence[int] | None = None) -> str:
    """The calls' grammar for `tools` (engine/constraints.py call_grammar: strict functions exactly, the others
    leniently), compiled and prepared in worker threads. A function not marked strict whose parameters cannot be
    enforced even leniently (`"type": "float"`, a lookahead pattern, a remote $ref, required naming an unlisted
    property) takes any JSON object as its arguments: OpenAI does not enforce such a schema. Raises APIError 400
    naming the strict tool whose parameters cannot be enforced (`indexes`: each tool's place in the request's
    `tools`), else `param`."""
    functions: list[CallFunction] = [(t["function"]["name"], t["function"].get("parameters"),
                                      bool(t["function"].get("strict"))) for t in tools]
    compile_calls = partial(call_grammar, opening=marker(markers.opening, markers.opening_ids),
                            closing=marker(markers.closing, markers.closing_ids), opened=opened, free_text=free_text)
    loose: list[str] = []
    while True:  # once, unless a function not marked strict cannot be enforced: then once more for each
        try:
            grammar = await anyio.to_thread.run_sync(compile_calls, functions)
            if prepare is not None:
                await anyio.to_thread.run_sync(prepare, GrammarSpec(None, calls=grammar))
            break
        except ParametersError as exc:
            name, parameters, strict = functions[exc.function]
            if strict or parameters is None:
                at = indexes[exc.function] if indexes is not None else exc.function
                raise APIError(400, str(exc), param=f"tools.{at}.function.parameters",
                               code="invalid_value") from None
            functions[exc.function] = (name, None, False)  # any JSON object
            loose.append(name)
        except ConstraintError as exc:
            raise APIError(400, str(exc), param=param, code="invalid_value") from None
    if loose:
        _log.debug("tools %s: arguments any JSON object (not strict; their parameters cannot be enforced)",
                   ", ".join(loose))
    return grammar


def _think_tokens(tokenizer: Any) -> tuple[int, int] | None:
    """A thinking block's start and end tokens, where each is one: a model that opens the block itself (Qwen3,
    SmolLM3) may think before its constrained answer. Raises nothing."""
    markers = OutputMarkers.from_tokenizer(tokenizer)  # mlx-lm's markers, or ours for a family it infers none of
    start, end = markers.think_start, markers.think_end
    if not start or not end:
        return None
    ids = list(_encode(tokenizer, start)), list(_encode(tokenizer, end))
    return (ids[0][0], ids[1][0]) if len(ids[0]) == 1 and len(ids[1]) == 1 else None


def _call_markers(tokenizer: Any, json_calls: bool) -> _Markers | None:
    """The model's tool-call markers; None when its calls have no opening marker (bare JSON) or no format is known.
    Raises nothing."""
    markers = OutputMarkers.from_tokenizer(tokenizer)
    if json_calls:
        markers = markers.with_json_tool_calls()
    if not markers.tool_call_start or markers.tool_parser is None:
        return None
    start, end = markers.tool_call_start, markers.tool_call_end or ""
    json_format = bool(end) and getattr(markers.tool_parser, "__module__", "").endswith("json_tools")
    return _Markers(start, list(_encode(tokenizer, start)), end, list(_encode(tokenizer, end)) if end else [],
                    json_format)


def _opening_marker(tokenizer: Any, opens_thinking: bool, harmony: bool, *, what: str = "JSON output",
                    param: str = "response_format") -> tuple[int, ...]:
    """The tokens after which the answer (`what`, asked for by `param`) is constrained. Raises APIError 400 for a
    thinking block whose end is not one token: written as text it may merge with what precedes it, the answer would
    never be seen to start."""
    if harmony:  # the answer's channel (special tokens around its name: nothing merges); analysis comes before it
        return tuple(_encode(tokenizer, "<|channel|>final<|message|>"))
    if not opens_thinking or not (end := OutputMarkers.from_tokenizer(tokenizer).think_end):
        return ()
    ids = tuple(_encode(tokenizer, end))
    if len(ids) != 1:
        raise APIError(400, f"{what} is not offered while this model thinks: its thinking block's end {end!r} is "
                            "not one token (switch thinking off: reasoning_effort \"none\")", param=param,
                       code="unsupported_value")
    return ids


def _encode(tokenizer: Any, text: str) -> Sequence[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))
