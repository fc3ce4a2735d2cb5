"""vLLM's structured outputs on chat and text completions: `structured_outputs` (one of `choice`, `regex`, `json`,
`grammar`, `json_object`, with JSON's layout options beside it) and the top-level `guided_*` fields vLLM 0.12 removed,
which Guidance and older clients still send (Guidance's vLLM backend both spellings at once). Each becomes a grammar
llguidance enforces token by token, as response_format's do (engine/constraints.py; service/chat/json_output.py
applies it after a thinking block and beside tools).

A request asks for one constraint: two different ones (among these fields, or beside chat's response_format) are a
400 naming both, the same one in both spellings is one. A backend selector (`guided_decoding_backend`,
`structured_outputs.backend`) is taken where it names a backend whose semantics llguidance's match, and refused
otherwise.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.constraints import ConstraintError, choice_grammar, json_grammar, lark_grammar, regex_grammar
from service.chat.strict_body import _Body
from service.http.errors import APIError

__all__ = ["StructuredOutputs", "StructuredOutputFields", "AskedConstraint", "asked_constraint"]

# vLLM's backends whose constraints mean what llguidance's do (vLLM's `guidance` is llguidance; xgrammar and outlines
# read the same JSON Schema, regular expressions and grammars): a client naming one gets the same replies here.
# lm-format-enforcer takes no grammar, and vLLM 0.8's "name:options" carried options its own fields now say.
BACKENDS = ("auto", "guidance", "llguidance", "xgrammar", "outlines")
_BACKEND = (f"Taken and ignored for {', '.join(repr(b) for b in BACKENDS)} (llguidance enforces every constraint "
            "here, with the same meaning); another is refused.")
# The constraints, as structured_outputs names them; the first four have a top-level guided_* spelling.
_KINDS = ("choice", "regex", "json", "grammar", "json_object")
_JSON_KINDS = ("json", "json_object")


def _known_backend(cls: Any, value: str | None) -> str | None:
    """A backend selector's validator. Raises ValueError for a backend this server does not stand in for."""
    if value is not None and value not in BACKENDS:
        raise ValueError(f"{value!r} is not a backend served here: constraints are enforced by llguidance, which "
                         f"stands in for {', '.join(BACKENDS)} (send one of those, or leave the field out)")
    return value


def _schema_object(cls: Any, value: Any) -> Any:
    """A JSON Schema's validator: an object, or JSON text of one (as vLLM takes it). Raises ValueError."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("text that is not JSON: send the JSON Schema as an object, or its JSON text") from None
    if value is not None and not isinstance(value, dict):
        raise ValueError("must be a JSON Schema object (or its JSON text)")
    return value


def _pattern(cls: Any, value: str | None) -> str | None:
    """A whitespace pattern's validator: a regular expression llguidance compiles. Raises ValueError."""
    if value is not None:
        try:
            regex_grammar(value)
        except ConstraintError as exc:
            raise ValueError(str(exc)) from None
    return value


_CHOICE = "The reply is exactly one of these strings."
_REGEX = "The whole reply matches this regular expression (Rust's regex syntax, as llguidance reads it)."
_JSON = ("The reply is JSON following this JSON Schema (an object, or its JSON text); keywords the engine lacks are "
         "ignored, the rest enforced.")
_GRAMMAR = ("The reply follows this grammar: llguidance's Lark (with a `%llguidance {}` header or without), or GBNF "
            "(`root ::= ...`), as vLLM's guidance backend reads it.")
_WHITESPACE = ("With json or json_object: the regular expression whitespace between JSON's tokens matches (the "
               "separators then \",\" and \":\"); left out, OpenAI's layout `{\"a\": 1, \"b\": 2}`.")


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its StructuredOutputsParams): one constraint, and JSON's layout options. Each
    field the server does not know is refused by name."""

    model_config = ConfigDict(extra="forbid", strict=True)

    choice: list[str] | None = Field(None, min_length=1, description=_CHOICE)
    regex: str | None = Field(None, description=_REGEX)
    # `json` is BaseModel's method: the field is named apart and read under vLLM's name.
    json_schema: dict[str, Any] | str | None = Field(None, alias="json", description=_JSON)
    grammar: str | None = Field(None, min_length=1, description=_GRAMMAR)
    json_object: bool | None = Field(None, description="Only true: the reply is any JSON object.")
    structural_tag: Any = Field(None, description="Not supported here (refused).")
    whitespace_pattern: str | None = Field(None, description=_WHITESPACE)
    disable_any_whitespace: bool | None = Field(
        None, description="With json or json_object: true writes JSON without whitespace (`{\"a\":1,\"b\":2}`); "
                          "false (the default) gives OpenAI's layout, which vLLM's false permits.")
    disable_additional_properties: bool | None = Field(
        None, description="With json: true refuses properties an object's schema does not name where it says "
                          "nothing of additionalProperties (as vLLM's guidance backend); by default they may come.")
    backend: str | None = Field(None, description=_BACKEND)

    _backend = field_validator("backend")(_known_backend)
    _json = field_validator("json_schema", mode="before")(_schema_object)
    _whitespace = field_validator("whitespace_pattern")(_pattern)

    @field_validator("json_object")
    @classmethod
    def _only_true(cls, value: bool | None) -> bool | None:
        if value is False:
            raise ValueError("only true (any JSON object); false asks for no constraint: leave structured_outputs out")
        return value

    @field_validator("structural_tag")
    @classmethod
    def _no_structural_tag(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not supported by this server: constrain the whole reply (json, regex, choice, "
                             "grammar), or use strict tools for calls")
        return value

    def constraint(self, kind: str) -> Any:
        """The constraint of `kind` (one of _KINDS) this object gives, None when it gives none. Raises nothing."""
        return self.json_schema if kind == "json" else getattr(self, kind)


class StructuredOutputFields(_Body):
    """The request fields of vLLM's structured outputs, shared by chat and text completions; asked_constraint reads
    them as one."""

    guided_choice: list[str] | None = Field(None, min_length=1, description=f"vLLM's older spelling of "
                                                                          f"structured_outputs.choice. {_CHOICE}")
    guided_regex: str | None = Field(None, description=f"vLLM's older spelling of structured_outputs.regex. {_REGEX}")
    guided_json: dict[str, Any] | str | None = Field(
        None, description=f"vLLM's older spelling of structured_outputs.json. {_JSON}")
    guided_grammar: str | None = Field(None, min_length=1, description=f"vLLM's older spelling of "
                                                                     f"structured_outputs.grammar. {_GRAMMAR}")
    guided_whitespace_pattern: str | None = Field(
        None, description=f"vLLM's older spelling of structured_outputs.whitespace_pattern. {_WHITESPACE}")
    guided_decoding_backend: str | None = Field(None, description=f"vLLM's older backend selector. {_BACKEND}")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM's: one of choice, regex, json, grammar or json_object (the same one may come beside "
                          "its guided_* spelling, as Guidance sends it; another constraint beside it is refused).")

    _backend = field_validator("guided_decoding_backend")(_known_backend)
    _json = field_validator("guided_json", mode="before")(_schema_object)
    _whitespace = field_validator("guided_whitespace_pattern")(_pattern)


@dataclass(frozen=True)
class AskedConstraint:
    """The one constraint a request asks of its reply: its kind (one of _KINDS), its value, the field that asked for
    it (as the client spelled it), and JSON's layout (llguidance's options; `closed`: objects take only the
    properties their schemas name)."""

    kind: str
    value: Any
    param: str
    layout: dict[str, Any] = field(default_factory=dict)
    closed: bool = False

    def grammar(self) -> str:
        """The constraint's grammar, compiled and checked (blocking: a large schema takes seconds). Raises
        ConstraintError saying what cannot be enforced."""
        if self.kind == "choice":
            return choice_grammar(self.value)
        if self.kind == "regex":
            return regex_grammar(self.value)
        if self.kind == "grammar":
            return lark_grammar(self.value)
        schema = self.value if self.kind == "json" else None
        if schema is not None and self.closed:
            schema = _closed(copy.deepcopy(schema))
        return json_grammar(schema, lenient=True, layout=self.layout)


def asked_constraint(body: StructuredOutputFields,
                     response_format: dict[str, Any] | None = None) -> AskedConstraint | None:
    """The constraint `body`'s structured-output fields ask for (None: none), beside chat's `response_format`. Raises
    APIError 400 naming the field: two different constraints, structured_outputs without one, or a JSON layout option
    beside a constraint that is not JSON."""
    nested = body.structured_outputs
    given: list[tuple[str, str, Any]] = []  # (field, kind, value), the guided_* spelling before the nested one
    for kind in _KINDS:
        if (top := getattr(body, f"guided_{kind}", None)) is not None:
            given.append((f"guided_{kind}", kind, top))
        if nested is not None and (value := nested.constraint(kind)) is not None:
            given.append((f"structured_outputs.{kind}", kind, value))
    # The same constraint in both spellings is one (named as vLLM now spells it); the guided_* fields named first.
    distinct = sorted((g for i, g in enumerate(given) if not any(o[1:] == g[1:] for o in given[i + 1:])),
                      key=lambda g: g[0].startswith("structured_outputs."))
    if len(distinct) > 1:
        raise APIError(400, f"{distinct[0][0]} and {distinct[1][0]} each constrain the reply: give one of them",
                       param=distinct[1][0], code="invalid_value")
    if distinct and response_format is not None and response_format.get("type") != "text":
        raise APIError(400, f"response_format and {distinct[0][0]} each constrain the reply: give one of them",
                       param=distinct[0][0], code="invalid_value")
    if nested is not None and not distinct:
        raise APIError(400, "structured_outputs names no constraint: give one of choice, regex, json, grammar or "
                            "json_object", param="structured_outputs", code="invalid_value")
    layout = _layout(body, distinct[0][1] if distinct else None)
    if not distinct:
        return None
    param, kind, value = distinct[0]
    return AskedConstraint(kind, value, param, layout,
                           closed=bool(nested is not None and nested.disable_additional_properties))


def _layout(body: StructuredOutputFields, kind: str | None) -> dict[str, Any]:
    """JSON's layout options asked (llguidance's names); {} for OpenAI's own. Raises APIError 400 naming an option
    beside a constraint that is not JSON (nothing there for it to shape), or options that disagree."""
    nested = body.structured_outputs
    options = [(f"structured_outputs.{name}", value) for name in ("whitespace_pattern", "disable_any_whitespace",
                                                                  "disable_additional_properties")
               if nested is not None and (value := getattr(nested, name)) not in (None, False)]
    if body.guided_whitespace_pattern is not None:
        options.insert(0, ("guided_whitespace_pattern", body.guided_whitespace_pattern))
    for name, _ in options:
        if kind not in _JSON_KINDS:
            beside = f"the reply follows a {kind}" if kind else "no constraint is asked"
            raise APIError(400, f"{name} shapes JSON output (json or json_object), and {beside}", param=name,
                           code="invalid_value")
    patterns = {value for name, value in options if name.endswith("whitespace_pattern")}
    if len(patterns) > 1:
        raise APIError(400, "guided_whitespace_pattern and structured_outputs.whitespace_pattern differ: give one",
                       param="structured_outputs.whitespace_pattern", code="invalid_value")
    compact = nested is not None and bool(nested.disable_any_whitespace)
    if patterns and compact:
        raise APIError(400, "structured_outputs.disable_any_whitespace leaves no whitespace for a whitespace_pattern "
                            "to shape: give one of them", param="structured_outputs.disable_any_whitespace",
                       code="invalid_value")
    if compact:
        return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    if patterns:
        return {"whitespace_flexible": True, "whitespace_pattern": patterns.pop(), "item_separator": ",",
                "key_separator": ":"}
    return {}


# Keywords whose value maps names to subschemas, and those whose value is a subschema or a list of them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "prefixItems", "additionalItems", "contains", "anyOf", "oneOf", "allOf", "not", "if", "then",
               "else", "additionalProperties", "unevaluatedProperties", "propertyNames")


def _closed(schema: Any) -> Any:
    """`schema` (a copy the caller owns) with `additionalProperties: false` on each object schema that names its
    properties and says nothing of others, as vLLM's disable_additional_properties has its guidance backend do.
    Raises nothing."""
    if isinstance(schema, list):
        for item in schema:
            _closed(item)
    elif isinstance(schema, dict):
        for key in _SCHEMA_MAPS:
            if isinstance(schema.get(key), dict):
                for sub in schema[key].values():
                    _closed(sub)
        for key in _SUBSCHEMAS:
            if isinstance(schema.get(key), (dict, list)):
                _closed(schema[key])
        if "additionalProperties" not in schema and (isinstance(schema.get("properties"), dict)
                                                     or isinstance(schema.get("patternProperties"), dict)):
            schema["additionalProperties"] = False
    return schema
