"""Constrained replies: a JSON schema (or any JSON object) or a regular expression the reply must follow, and tool calls
whose arguments must follow their functions' schemas (OpenAI's `strict`), enforced token by token.

llguidance (the constraint engine llama.cpp, vLLM and SGLang use) compiles the grammar and, before each token, says
which tokens keep the text valid; the row's sampler masks the others out (engine/sampling.py). A reply goes through
phases (GrammarSpec): free until its `after` tokens (a thinking block's end, or a call's opening marker), then the
answer's grammar, whose first token may instead be the call marker (`escape`), then the calls' grammar (or free).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from engine.contracts import GrammarSpec
from engine.errors import InvalidRequest
from engine.schema_refs import ref_cycle, rooted

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = ["ConstraintError", "ConstraintFailed", "Constraint", "ConstraintTokenizer", "json_grammar", "regex_grammar",
           "choice_grammar", "lark_grammar", "call_grammar", "CallFunction", "ParametersError", "marker", "brief"]


class ConstraintError(InvalidRequest):
    """A schema the constraint engine cannot enforce; the message says which part."""


# OpenAI's layout (`{"a": 1, "b": 2}`); free whitespace let small models write newlines until max_tokens. A schema's
# own "x-guidance" options override it.
_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_grammar(schema: dict[str, Any] | None, *, lenient: bool = False, layout: dict[str, Any] | None = None) -> str:
    """The grammar of JSON text following `schema` (None: any JSON object), checked. `lenient`: keywords llguidance
    does not implement (`uniqueItems`, `not`, ...) are ignored, as a schema not marked strict may be followed
    approximately; `layout`: llguidance's whitespace and separator options over OpenAI's layout (the schema's own
    "x-guidance" still wins). Raises ConstraintError naming what llguidance cannot compile (an unknown format, a
    dangling $ref, a type that is not one, an unimplemented keyword when not lenient)."""
    from llguidance import LLMatcher

    if (cycle := ref_cycle(schema)) is not None:
        raise ConstraintError(f"the schema cannot be enforced: $ref {cycle!r} leads only to itself (a cycle of $refs "
                              f"that never reaches a schema)")
    try:
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema if schema is not None else {"type": "object"}),
                                                     defaults=cast(Any, {**_LAYOUT, **(layout or {}),
                                                                         "lenient": lenient}))
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ConstraintError(f"the schema cannot be enforced: {brief(str(exc))}") from None
    hint = "" if lenient else " (with strict: false keywords the engine lacks are ignored and the rest enforced)"
    return _checked(grammar, "the schema", hint)


def regex_grammar(pattern: str) -> str:
    """The grammar of text the regular expression `pattern` matches whole (TGI's `regex` grammar; Rust's regex syntax,
    as llguidance's lexer reads it), checked. Raises ConstraintError saying what is wrong with the pattern."""
    from llguidance import LLMatcher

    grammar = LLMatcher.grammar_from_regex(pattern)
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        # The parser's own line ("error: unclosed group"); the rest is the pattern echoed inside a generated grammar.
        said = "\n".join(messages)
        reason = next((line[len("error: "):] for line in said.split("\n") if line.startswith("error: ")), brief(said))
        raise ConstraintError(f"the pattern cannot be enforced: {reason}")
    return str(grammar)


def choice_grammar(choices: list[str]) -> str:
    """The grammar of text that is exactly one of `choices` (vLLM's `choice`), checked. Raises ConstraintError."""
    from llguidance import LLMatcher

    # JSON's string escapes are Lark's: any text is one literal.
    return _checked(LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices) + "\n"),
                    "the choices")


def lark_grammar(text: str) -> str:
    """The grammar `text` writes: llguidance's Lark (its `%llguidance {}` header or not, as Guidance sends it), or
    GBNF (llama.cpp's and xgrammar's EBNF, `root ::= ...`) converted to it, as vLLM's guidance backend reads
    `grammar`; checked. Raises ConstraintError saying what is wrong with it."""
    import llguidance

    try:
        grammar = llguidance.grammar_from("grammar", text)
    except (ValueError, TypeError, RuntimeError) as exc:  # GBNF that does not convert
        raise ConstraintError(f"the grammar cannot be enforced: {brief(str(exc))}") from None
    return _checked(grammar, "the grammar")


def _checked(grammar: str, what: str, unimplemented_hint: str = "") -> str:
    """`grammar` once llguidance has validated it. Raises ConstraintError saying why `what` cannot be enforced (with
    the hint where a keyword is not implemented)."""
    from llguidance import LLMatcher

    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        said = "; ".join(messages)
        raise ConstraintError(f"{what} cannot be enforced: {brief(said)}"
                              + (unimplemented_hint if "Unimplemented" in said else ""))
    return str(grammar)


# A function the calls may name: its name, its parameters (None: any JSON object), and whether it is strict (OpenAI's
# `strict`: its schema enforced exactly; not strict: keywords llguidance lacks ignored, the rest enforced).
CallFunction = tuple[str, "dict[str, Any] | None", bool]


class ParametersError(ConstraintError):
    """A function's parameters that cannot be enforced; `function`: its place in call_grammar's `functions`."""

    def __init__(self, message: str, *, function: int) -> None:
        super().__init__(message)
        self.function = function


def call_grammar(functions: list[CallFunction], *, opening: str, closing: str, opened: bool = True,
                 free_text: str | None = None) -> str:
    """The grammar of tool calls written as `{"name": ..., "arguments": {...}}` between the family's markers (the
    <tool_call> JSON of Hermes, Qwen 2.5 and 3, and of models told their tools in the prompt), from just after the
    first opening marker: each call's arguments follow its function's schema, strictly or leniently as that function
    is, and calls may follow one another. `opening`/`closing`: the markers as llguidance's Lark writes them (`marker`);
    `opened` false: from the reply's first token, the first marker included (a forced call); `free_text`: the opening
    marker as text (several tokens): the reply is free text, or free text up to that marker and calls from there, the
    marker found in the text whatever tokens wrote it. Raises ParametersError naming the first function whose
    parameters cannot be enforced, ConstraintError for the rest."""
    from llguidance import LLMatcher

    # Each function its own %json: one schema's anyOf took one strictness for all, and llguidance drops a branch it
    # finds unsatisfiable (required naming an unlisted property), that function silently never callable.
    calls = [_call_schema(i, function) for i, function in enumerate(functions)]
    rules = [f"call: WS? body WS? {closing}", "body: " + " | ".join(f"f{i}" for i in range(len(calls))),
             *(f"f{i}: %json {json.dumps(call)}" for i, call in enumerate(calls)),
             "WS: /[ \\t\\n]{1,3}/"]  # bounded: a small model wrote whitespace until max_tokens
    first = "call" if opened else f"{opening} call"
    if free_text is not None:  # a lazy lexeme ends at the marker's first appearance: the calls' branch from there
        first = "FREE | opening call"
        rules += ["FREE: /(?s:.*)/", f"opening[lazy]: /(?s:.*){re.escape(free_text)}/"]
    grammar = LLMatcher.grammar_from_lark("\n".join([f"start: {first} (WS? {opening} call)*", *rules]) + "\n")
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:  # which function: each checked alone, on this error path only
        for i, ((name, _, strict), call) in enumerate(zip(functions, calls)):
            try:
                json_grammar(call, lenient=not strict)
            except ConstraintError as alone:
                why = alone.message.removeprefix("the schema cannot be enforced")
                if unlisted := _unlisted_required(functions[i][1]):  # llguidance blames the call's "arguments"
                    why = (f": `required` names {', '.join(map(repr, unlisted))}, which `properties` does not list "
                           f"and additionalProperties false refuses")
                raise ParametersError(f"tool {name!r}: its parameters cannot be enforced{why}", function=i) from None
        raise ConstraintError(f"the functions' parameters cannot be enforced: {brief('; '.join(messages))}")
    return str(grammar)


def _unlisted_required(schema: dict[str, Any] | None) -> list[str]:
    """The names a schema's own `required` lists that no property may take (not in `properties`, additionalProperties
    false). Raises nothing."""
    if not isinstance(schema, dict) or schema.get("additionalProperties") is not False:
        return []
    listed, required = schema.get("properties"), schema.get("required")
    listed = listed if isinstance(listed, dict) else {}
    required = required if isinstance(required, list) else []
    return [name for name in required if isinstance(name, str) and name not in listed]


def _call_schema(at: int, function: CallFunction) -> dict[str, Any]:
    """The schema of one call of `function` (its place `at`): its name, then its arguments, in OpenAI's layout, as
    leniently as it is not strict. Raises ParametersError for a cycle of $refs (llguidance takes one, and it then
    constrains nothing or fails mid-reply)."""
    name, schema, strict = function
    if (cycle := ref_cycle(schema)) is not None:
        raise ParametersError(f"tool {name!r}: its parameters cannot be enforced: $ref {cycle!r} leads only to itself "
                              f"(a cycle of $refs that never reaches a schema)", function=at)
    arguments = rooted(schema, "/properties/arguments") if schema else {"type": "object"}
    return {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": name}, "arguments": arguments},
            "x-guidance": {**_LAYOUT, "lenient": not strict}}


def marker(text: str, tokens: list[int]) -> str:
    """A marker as llguidance's Lark matches it: its token when it is one (a special token is not text to the
    lexer), else its text. Raises nothing."""
    return f"<[{tokens[0]}]>" if len(tokens) == 1 else json.dumps(text)


class ConstraintTokenizer:
    """The model's tokenizer as llguidance reads it, built once on first use (~0.4 s for 49k tokens on a 2-core CPU:
    the service's first grammar builds it in a worker thread, `prepare`), and the grammars' prepared matchers."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size  # the logits' width (an embedding may be wider than the tokenizer)
        self._built: Any = None
        self._prototypes: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The llguidance tokenizer. Raises ValueError for a tokenizer llguidance cannot read (a slow one)."""
        with self._lock:
            if self._built is None:
                import llguidance.hf

                hf = getattr(self._tokenizer, "_tokenizer", self._tokenizer)
                eos = sorted(getattr(self._tokenizer, "eos_token_ids", None) or []) or None
                self._built = llguidance.hf.from_tokenizer(hf, eos_token=eos)
            return self._built

    def prepare(self, spec: GrammarSpec) -> None:
        """Build the spec's matchers now (blocking: llguidance builds a large schema's lexer in seconds, so the
        service calls this in a worker thread before it submits). Raises ConstraintError as `constraint`."""
        for grammar in (spec.text, spec.calls):
            if grammar is not None:
                self._prototype(grammar)

    def constraint(self, spec: GrammarSpec) -> "Constraint":
        """A fresh matcher for one row, copied from the grammar's prepared one (built here when not prepared). Raises
        ConstraintError when a grammar does not compile for this tokenizer or admits no text at all."""
        answer = self._prototype(spec.text).deep_copy() if spec.text is not None else None
        calls: Any = self._prototype(spec.calls) if spec.calls is not None else None
        return Constraint(answer, self.vocab_size, spec, lambda: calls.deep_copy())

    def _prototype(self, grammar: str) -> Any:
        with self._lock:
            if (kept := self._prototypes.get(grammar)) is not None:
                self._prototypes.move_to_end(grammar)
                return kept
        try:
            tokenizer = self.get()
        except Exception as exc:  # noqa: BLE001 — e.g. a slow (Python) tokenizer llguidance cannot read
            raise ConstraintError(f"constrained output is not available for this model: its tokenizer cannot be "
                                  f"read by the constraint engine ({type(exc).__name__}: {exc})") from None
        matcher = _matcher(tokenizer, grammar)
        # Its first mask, now: a schema past the engine's limits fails here (a 400), not mid-reply, and one that admits
        # no text at all (a $ref cycle from the root) is refused rather than answered with nothing.
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        if matcher.is_error():
            raise ConstraintError(f"the schema cannot be enforced: {brief(matcher.get_error())}")
        if not bits.any():
            raise ConstraintError("the schema admits no JSON text (a $ref that can never end?)")
        with self._lock:
            self._prototypes[grammar] = matcher
            while len(self._prototypes) > _PROTOTYPES_KEPT:
                self._prototypes.popitem(last=False)
        return matcher


# Prepared matchers kept by grammar (a client's requests repeat one schema); each row works on a copy.
_PROTOTYPES_KEPT = 32


def brief(error: str) -> str:
    """llguidance's error without the parser state and grammar it appends (kilobytes of a client's schema).
    Raises nothing."""
    head = error.split("\n<state>")[0].split("\n")[0]
    return head if len(head) <= 300 else head[:300] + "…"


class ConstraintFailed(RuntimeError):
    """A row's grammar failed mid-reply (past the engine's limits, or no token continues it): that row ends. `param`:
    the request field that asked for it (the answer's schema, or the tools' for a call)."""

    def __init__(self, message: str, *, param: str = "response_format") -> None:
        super().__init__(message)
        self.param = param


def _matcher(tokenizer: Any, grammar: str) -> Any:
    from llguidance import LLMatcher

    try:
        matcher = LLMatcher(tokenizer, grammar)
    except ValueError as exc:
        raise ConstraintError(f"the schema cannot be enforced with this model's tokenizer: {brief(str(exc))}") from None
    if matcher.is_error():
        raise ConstraintError(f"the schema cannot be enforced: {brief(matcher.get_error())}")
    return matcher


class Constraint:
    """One row's matcher through the reply's phases (module docstring): the mask for its next token, advanced by
    each token it samples. Used by one thread at a time (the row's sampler)."""

    def __init__(self, answer: Any, vocab_size: int, spec: GrammarSpec, calls: Callable[[], Any]) -> None:
        self._matcher = answer  # None: the answer is free (only calls are constrained)
        self._vocab = vocab_size
        self._after = spec.after  # tokens before which nothing is constrained
        self._escape = spec.escape
        self._think = spec.think  # the answer may open with a thinking block instead, once
        self._calls = calls if spec.calls is not None else None
        self._recent: list[int] = []
        self._started = False  # a token of the answer was taken
        self._off = False  # nothing more is constrained
        self._in_calls = False  # the calls' grammar is being followed
        if self._matcher is None and not self._after:
            self._enter_calls()

    @property
    def active(self) -> bool:
        return not self._after and not self._off

    @property
    def _param(self) -> str:
        """The request field whose grammar is being followed now. Raises nothing."""
        return "tools" if self._in_calls else "response_format"

    def _enter_calls(self) -> None:
        """A call opened: its grammar from here, or nothing constrained when no function is strict."""
        self._matcher = self._calls() if self._calls is not None else None
        self._in_calls = True
        self._escape = None
        self._started = True
        self._off = self._matcher is None

    def mask(self) -> "mx.array | None":
        """True for each token that keeps the reply valid, (1, vocab); None while not constrained. Raises
        ConstraintFailed when the grammar failed or no token continues it."""
        import mlx.core as mx

        if not self.active:
            return None
        if self._matcher.is_error():
            raise ConstraintFailed(f"the reply's schema failed: {brief(self._matcher.get_error())}", param=self._param)
        bits = np.unpackbits(np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        if self._matcher.is_error():
            raise ConstraintFailed(f"the reply's schema went past the constraint engine's limits: "
                                   f"{brief(self._matcher.get_error())}", param=self._param)
        allowed = np.zeros(self._vocab, dtype=np.bool_)
        width = min(self._vocab, bits.shape[0])
        allowed[:width] = bits[:width]
        if not self._started:
            for token in (self._escape, self._think[0] if self._think else None):
                if token is not None and token < self._vocab:
                    allowed[token] = True
        if not allowed.any():
            raise ConstraintFailed("the reply's schema admits no token here (a $ref that can never end?)",
                                   param=self._param)
        return mx.array(allowed)[None]

    def accept(self, token: int) -> None:
        """Advance past a sampled token (before the constrained part: watch for its opening). Raises nothing."""
        if self._off:
            return
        if self._after:
            self._recent = (self._recent + [token])[-len(self._after):]
            if tuple(self._recent) == self._after:
                self._after = ()
                if self._matcher is None:  # the opening was a call's marker
                    self._enter_calls()
            return
        if not self._started and token == self._escape:
            self._enter_calls()
            return
        if not self._started and self._think is not None and token == self._think[0]:
            self._after, self._think = (self._think[1],), None  # free until the block ends; the answer after it
            return
        self._started = True
        self._matcher.consume_token(token)  # a refused token shows as is_error() at the next mask
