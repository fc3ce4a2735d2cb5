"""service/chat/json_output.py: which grammar a response_format and strict tools ask for, and from where in the reply
it applies — after the thinking block a reply opens in, after harmony's final-channel header, from a call's opening
marker, else from the first token."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.contracts import GrammarSpec
from service.chat.json_output import reply_grammar
from service.http.errors import APIError



TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "properties": {
    "ok": {"type": "boolean"}}, "required": ["ok"]}}}


class _Tokenizer:
    """Encodes each marker as one id, as families whose markers are special tokens do."""

    def __init__(self, vocab: dict[str, int], think_end: str | None = None, call_start: str | None = None) -> None:
        self._vocab, self.think_end = vocab, think_end
        self.think_start = think_end.replace("/", "") if think_end else None  # as mlx-lm's wrapper names both
        if call_start is not None:  # mlx-lm's wrapper names a family's call markers beside its parser
            from mlx_lm.tool_parsers import json_tools

            self.tool_parser, self.tool_call_start = json_tools.parse_tool_call, call_start
            self.tool_call_end = call_start.replace("<", "</")

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, rest = [], text
        while rest:
            marker = next(m for m in self._vocab if rest.startswith(m))
            ids.append(self._vocab[marker])
            rest = rest[len(marker):]
        return ids


async def _grammar(tokenizer: Any, response_format: Any, tools: Any = None, **kw: Any) -> GrammarSpec | None:
    return await reply_grammar(response_format, tools, tokenizer=tokenizer,
                               **{"opens_thinking": False, "calls": tools is not None, **kw})


@pytest.mark.anyio
async def test_the_grammar_applies_after_a_thinking_block_the_reply_opens_in() -> None:
    thinker = _Tokenizer({"<think>": 5, "</think>": 6}, think_end="</think>")
    grammar = await _grammar(thinker, SCHEMA, opens_thinking=True)
    assert grammar is not None and '"ok"' in grammar.text and grammar.after == (6,) and grammar.escape is None
    # Not opened by the template: constrained from the first token, which may open the block instead (Qwen3 and
    # SmolLM3 decide to think themselves; a schema switched that off).
    off = await _grammar(thinker, SCHEMA)
    assert off is not None and off.after == () and off.think == (5, 6)


@pytest.mark.anyio
async def test_a_thinking_end_written_as_text_is_refused() -> None:
    # "</think>" as three tokens may merge with the thinking's last characters: the answer would never start.
    split = _Tokenizer({"</": 1, "<": 4, "think": 2, ">": 3}, think_end="</think>")
    with pytest.raises(APIError) as caught:
        await _grammar(split, SCHEMA, opens_thinking=True)
    assert caught.value.param == "response_format" and "reasoning_effort" in caught.value.message
    assert await _grammar(split, SCHEMA) is not None  # thinking off: from the first token


@pytest.mark.anyio
async def test_a_harmony_reply_is_constrained_in_its_final_channel() -> None:
    harmony = _Tokenizer({"<|start|>": 1, "<|end|>": 2, "<|message|>": 3, "<|channel|>": 4, "final": 9})
    grammar = await _grammar(harmony, {"type": "json_object"}, [TOOL])  # its calls go to another channel
    assert grammar is not None and grammar.after == (4, 9, 3) and grammar.escape is None


@pytest.mark.anyio
async def test_beside_tools_a_one_token_call_marker_may_open_the_reply() -> None:
    qwen = _Tokenizer({"<tool_call>": 7, "</tool_call>": 8, "<": 1, "/": 5, "tool": 2, "_call": 3, ">": 4},
                      call_start="<tool_call>")
    grammar = await _grammar(qwen, SCHEMA, [TOOL])
    assert grammar is not None and grammar.escape == 7 and grammar.calls is None  # the call itself is free
    # Told of its tools in our words, a model without the special token writes "<tool_call>" in four tokens.
    plain = _Tokenizer({"<": 1, "/": 5, "tool": 2, "_call": 3, ">": 4})
    with pytest.raises(APIError) as caught:
        await _grammar(plain, SCHEMA, [TOOL], json_calls=True)
    assert caught.value.status == 400 and caught.value.param == "response_format"


@pytest.mark.anyio
async def test_strict_tools_constrain_calls_from_their_opening_marker() -> None:
    qwen = _Tokenizer({"<tool_call>": 7, "</tool_call>": 8, "<": 1, "/": 5, "tool": 2, "_call": 3, ">": 4},
                      call_start="<tool_call>")
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    only_calls = await _grammar(qwen, None, [strict, TOOL])
    assert only_calls is not None and only_calls.text is None and only_calls.after == (7,)
    assert only_calls.calls is not None and '"city"' in only_calls.calls and "<[8]>" in only_calls.calls
    both = await _grammar(qwen, SCHEMA, [strict])
    assert both is not None and both.text is not None and both.escape == 7 and both.calls is not None
    # Told in the prompt, a model without the special token writes the marker as text, which may merge with what
    # precedes it: the grammar finds it in the text, from the first token. Bare JSON calls and harmony's channels
    # have no marker: refused.
    plain = _Tokenizer({"<": 1, "/": 5, "tool": 2, "_call": 3, ">": 4})
    told = await _grammar(plain, None, [strict], json_calls=True)
    assert told is not None and told.after == () and "opening[lazy]" in (told.calls or "")
    for tokenizer in (_Tokenizer({"a": 1}), _Tokenizer({"<|start|>": 1, "<|end|>": 2, "<|message|>": 3,
                                                        "<|channel|>": 4})):
        with pytest.raises(APIError) as caught:
            await _grammar(tokenizer, None, [TOOL, strict])
        assert caught.value.param == "tools.1.function.strict"
    assert await _grammar(qwen, None, [strict], calls=False) is None  # tool_choice "none": no call to constrain


@pytest.mark.anyio
async def test_text_asks_for_nothing_and_an_unenforceable_schema_is_refused() -> None:
    plain = _Tokenizer({"a": 1})
    assert await _grammar(plain, None) is None
    assert await _grammar(plain, {"type": "text"}) is None
    nope = {"format": "nope", "type": "string"}
    with pytest.raises(APIError, match="Unknown format"):
        await _grammar(plain, {"type": "json_schema", "json_schema": {"name": "x", "schema": nope, "strict": True}})


@pytest.mark.anyio
async def test_a_schema_not_marked_strict_is_followed_leniently() -> None:
    # pydantic writes `uniqueItems` for a set: OpenAI's strict mode refuses it, its default mode does not.
    plain = _Tokenizer({"a": 1})
    tags = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                      "uniqueItems": True}}}
    assert await _grammar(plain, {"type": "json_schema", "json_schema": {"name": "x", "schema": tags}}) is not None
    with pytest.raises(APIError) as caught:
        await _grammar(plain, {"type": "json_schema", "json_schema": {"name": "x", "schema": tags, "strict": True}})
    assert "uniqueItems" in caught.value.message and "strict: false" in caught.value.message


def test_the_engine_builds_a_requests_matchers_off_the_event_loop(client: Any, fake_engine: Any) -> None:
    # llguidance took 2 s to build an 8,000-property schema's lexer on the event loop: /health stalled 5 s.
    import threading

    seen: list[str] = []
    fake_engine.prepare_grammar = lambda spec: seen.append(threading.current_thread().name)
    reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "response_format": SCHEMA})
    assert reply.status_code == 200, reply.text
    assert len(seen) == 1 and seen[0] != threading.main_thread().name and "AnyIO worker" in seen[0]
    assert fake_engine.requests[-1].sampling.grammar is not None


@pytest.mark.anyio
async def test_a_forced_call_is_constrained_from_the_first_token() -> None:
    qwen = _Tokenizer({"<tool_call>": 7, "</tool_call>": 8, "<": 1, "/": 5, "tool": 2, "_call": 3, ">": 4},
                      call_start="<tool_call>")
    other = {"type": "function", "function": {"name": "other"}}
    named = await _grammar(qwen, SCHEMA, [TOOL, other], forced="get_weather")  # a forced call wins over the format
    assert named is not None and named.text is None and named.after == () and named.calls is not None
    assert named.calls.startswith("start: <[7]> call") and "get_weather" in named.calls and "other" not in named.calls
    anyone = await _grammar(qwen, None, [TOOL, other], forced=True)
    assert anyone is not None and anyone.calls is not None and "other" in anyone.calls
    with pytest.raises(APIError) as caught:  # bare JSON calls: no marker to write
        await _grammar(_Tokenizer({"a": 1}), None, [TOOL], forced=True)
    assert caught.value.param == "tool_choice"


@pytest.mark.anyio
async def test_a_forced_call_while_thinking_names_tool_choice() -> None:
    split = _Tokenizer({"</": 1, "<": 4, "think": 2, ">": 3, "tool": 5, "_call": 6}, think_end="</think>",
                       call_start="<tool_call>")
    with pytest.raises(APIError) as caught:
        await _grammar(split, None, [TOOL], forced=True, opens_thinking=True)
    assert caught.value.param == "tool_choice" and caught.value.message.startswith("A forced tool call")


def _engine_grammar(client: Any, fake_engine: Any, response_format: Any) -> Any:
    reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "response_format": response_format})
    assert reply.status_code == 200, reply.text
    return fake_engine.requests[-1].sampling.grammar.text


def test_tgis_grammars_are_enforced_as_chats_own(client: Any, fake_engine: Any) -> None:
    # huggingface_hub's InferenceClient rewrites json_schema to TGI's {"type": "json_object", "value": schema}, and
    # TGI's clients send {"type": "json" | "regex", "value": ...}: all were a 400, so no JSON output through it.
    from engine.constraints import regex_grammar

    schema = SCHEMA["json_schema"]["schema"]
    openai = _engine_grammar(client, fake_engine, SCHEMA)
    assert _engine_grammar(client, fake_engine, {"type": "json_object", "value": schema}) == openai
    assert _engine_grammar(client, fake_engine, {"type": "json", "value": schema}) == openai
    assert _engine_grammar(client, fake_engine, {"type": "json", "value": json.dumps(schema)}) == openai  # TGI's text
    assert _engine_grammar(client, fake_engine, {"type": "regex", "value": "(yes|no)"}) == regex_grammar("(yes|no)")
    anything = _engine_grammar(client, fake_engine, {"type": "json_object"})  # OpenAI's: still any JSON object
    assert anything == _engine_grammar(client, fake_engine, {"type": "json_object", "value": None}) != openai


@pytest.mark.parametrize("response_format, param, words", [
    ({"type": "regex", "value": "(yes"}, "response_format.value", "unclosed group"),
    ({"type": "json", "value": {"type": 5}}, "response_format.value", "type must be a string"),
    ({"type": "regex", "value": 5}, "response_format", "regex's value must be the pattern"),
    ({"type": "regex"}, "response_format", "regex's value must be the pattern"),
    ({"type": "json", "value": [1]}, "response_format", "json's value must be a JSON Schema object"),
    ({"type": "json", "value": "{nope"}, "response_format", "not JSON"),
    ({"type": "json", "value": {}, "name": "x"}, "response_format", "json takes only value (name)"),
])
def test_a_tgi_grammar_that_cannot_be_enforced_is_a_400_naming_its_part(client: Any, response_format: Any,
                                                                        param: str, words: str) -> None:
    reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "response_format": response_format})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == param and words in error["message"], error


NAMED = {"type": "object", "properties": {"name": {"enum": ["a", "bc"]}}, "required": ["name"],
         "additionalProperties": False}
NESTED = {"$defs": {"Named": NAMED}, "type": "object", "additionalProperties": False, "required": ["p", "q"],
          "properties": {"p": {"$ref": "#/$defs/Named"},
                         "q": {"type": "array", "items": {"$ref": "#/$defs/Named"}, "maxItems": 2}}}


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "f"}}, "required"])
def test_a_forced_call_of_a_pydantic_nested_model_follows_it(tiny_loaded: Any, choice: Any) -> None:
    # Pydantic's $defs (instructor's TOOLS modes, strict agent tools) were a 400: "Pointer '/$defs/P' does not exist".
    from litestar.testing import TestClient

    from engine.runtime import Engine
    from service.app import create_app
    from service.state import AppState

    tools = [{"type": "function", "function": {"name": "f", "parameters": NESTED, "strict": True}}]
    with TestClient(create_app(AppState(engine=Engine(tiny_loaded, max_iteration_tokens=8)))) as client:
        reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                          "tools": tools, "tool_choice": choice, "max_tokens": 200,
                                                          "temperature": 0})
    assert reply.status_code == 200, reply.text
    call = reply.json()["choices"][0]["message"]["tool_calls"][0]  # the random model may go on to others
    arguments = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "f" and set(arguments) == {"p", "q"} and len(arguments["q"]) <= 2
    assert all(set(named) == {"name"} and named["name"] in ("a", "bc") for named in [arguments["p"], *arguments["q"]])


@pytest.mark.anyio
@pytest.mark.parametrize("forced", [None, True, "bad_tool"])
async def test_a_strict_schema_that_cannot_be_enforced_names_its_tool(forced: Any) -> None:
    # Playwright's MCP tools through LangChain's strict conversion: the third tool's `propertyNames` cannot be
    # enforced, and the 400 named the first strict tool (tools.0), or `tools` with a forced call.
    qwen = _Tokenizer({"<tool_call>": 7, "</tool_call>": 8, "<": 1, "/": 5, "tool": 2, "_call": 3, ">": 4},
                      call_start="<tool_call>")
    bad = {"type": "object", "properties": {"d": {"type": "object", "propertyNames": {"pattern": "^x"},
                                                  "additionalProperties": {"type": "string"}}}}
    tools = [{"type": "function", "function": {**TOOL["function"], "name": name, "strict": True}}
             for name in ("good_one", "other")]
    tools.append({"type": "function", "function": {"name": "bad_tool", "parameters": bad, "strict": True}})
    with pytest.raises(APIError) as caught:
        await _grammar(qwen, None, tools, **({"forced": forced} if forced is not None else {}))
    assert caught.value.param == "tools.2.function.parameters", caught.value.param
    assert caught.value.message.startswith("tool 'bad_tool': ") and "propertyNames" in caught.value.message


# Parameters llguidance cannot enforce even leniently, as hand-written tools send them.
UNENFORCEABLE = {
    "float": {"type": "object", "properties": {"x": {"type": "float"}}},  # not a JSON Schema type
    "lookahead": {"type": "object", "properties": {"password": {"type": "string", "pattern": "(?=.*\\d)"}}},
    "remote $ref": {"$ref": "https://example.com/s.json"},
    "required unlisted": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"],
                          "additionalProperties": False},
}
QWEN = {"<tool_call>": 7, "</tool_call>": 8, "<": 1, "/": 5, "tool": 2, "_call": 3, ">": 4}


def _takes(tiny_loaded: Any, grammar: str, opened: bool, name: str, arguments: Any) -> bool:
    """Whether the calls' grammar (markers 7 and 8) takes the call of `name` with `arguments`, and may end there."""
    from llguidance import LLMatcher

    from engine.constraints import ConstraintTokenizer

    matcher = LLMatcher(ConstraintTokenizer(tiny_loaded.tokenizer, tiny_loaded.model.args.vocab_size).get(), grammar)
    call = json.dumps({"name": name, "arguments": arguments})
    tokens = [*([] if opened else [7]), *tiny_loaded.tokenizer.encode(call, add_special_tokens=False), 8]
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


# Beside another function too: llguidance dropped the unsatisfiable branch ("required unlisted") of the calls' one
# schema, and the rest compiled: that tool could never be called, strict or not, and nothing said so.
CASES = [pytest.param(schema, forced, id=f"{kind}-{forced}") for kind, schema in UNENFORCEABLE.items()
         for forced in (None, True, "f")]


@pytest.mark.anyio
@pytest.mark.parametrize("schema, forced", CASES)
async def test_a_tool_not_marked_strict_whose_parameters_cannot_be_enforced_takes_any_object(
        tiny_loaded: Any, schema: Any, forced: Any) -> None:
    # OpenAI does not enforce a schema not marked strict: a forced call of such a tool was a 400 here only
    # (tools.1.function.parameters), as was any request beside a strict tool. Its neighbour's schema still holds.
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    tools = [strict, {"type": "function", "function": {"name": "f", "parameters": schema}}]
    grammar = await _grammar(_Tokenizer(QWEN, call_start="<tool_call>"), None, tools,
                             **({"forced": forced} if forced is not None else {}))
    assert grammar is not None and grammar.calls is not None
    opened = forced is None
    assert _takes(tiny_loaded, grammar.calls, opened, "f", {"x": "text", "n": [1, {"b": None}]})
    assert not _takes(tiny_loaded, grammar.calls, opened, "f", [1])  # still a JSON object
    if forced != "f":
        assert _takes(tiny_loaded, grammar.calls, opened, "get_weather", {"city": "Oslo"})
        assert not _takes(tiny_loaded, grammar.calls, opened, "get_weather", {"town": "Oslo"})


@pytest.mark.anyio
@pytest.mark.parametrize("schema, forced", CASES)
async def test_a_strict_tool_whose_parameters_cannot_be_enforced_is_still_refused(schema: Any, forced: Any) -> None:
    tools = [TOOL, {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}]
    with pytest.raises(APIError) as caught:
        await _grammar(_Tokenizer(QWEN, call_start="<tool_call>"), None, tools,
                       **({"forced": forced} if forced is not None else {}))
    assert caught.value.param == "tools.1.function.parameters" and caught.value.message.startswith("tool 'f': ")


@pytest.mark.parametrize("schema", UNENFORCEABLE.values(), ids=UNENFORCEABLE.keys())
def test_a_forced_call_of_a_tool_not_marked_strict_is_answered_whatever_its_parameters(tiny_loaded: Any,
                                                                                      schema: Any) -> None:
    from litestar.testing import TestClient

    from engine.runtime import Engine
    from service.app import create_app
    from service.state import AppState

    tools = [{"type": "function", "function": {"name": "f", "parameters": schema, "strict": False}}]
    with TestClient(create_app(AppState(engine=Engine(tiny_loaded, max_iteration_tokens=8)))) as client:
        reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                          "tools": tools, "max_tokens": 200, "temperature": 0,
                                                          "tool_choice": {"type": "function", "function": {
                                                              "name": "f"}}})
    assert reply.status_code == 200, reply.text
    call = reply.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "f" and isinstance(json.loads(call["function"]["arguments"]), dict), call


UNIQUE = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
          "required": ["tags"], "additionalProperties": False}


@pytest.mark.anyio
@pytest.mark.parametrize("forced", [None, True])
async def test_a_strict_tool_beside_one_not_marked_strict_is_still_strict(forced: Any) -> None:
    # One `lenient` for the whole request: beside a tool not marked strict, a strict tool's `uniqueItems` was ignored
    # where OpenAI refuses a strict schema it cannot enforce.
    tools = [{"type": "function", "function": {"name": "loose", "parameters": UNIQUE}},
             {"type": "function", "function": {"name": "exact", "parameters": UNIQUE, "strict": True}}]
    with pytest.raises(APIError) as caught:
        await _grammar(_Tokenizer(QWEN, call_start="<tool_call>"), None, tools,
                       **({"forced": forced} if forced is not None else {}))
    assert caught.value.param == "tools.1.function.parameters", caught.value.param
    assert caught.value.message.startswith("tool 'exact': ") and "uniqueItems" in caught.value.message


@pytest.mark.anyio
@pytest.mark.parametrize("forced", [None, True])
async def test_each_tool_is_enforced_on_its_own_terms(tiny_loaded: Any, forced: Any) -> None:
    # The strict tool exactly; beside it, the one not marked strict with what the engine lacks (uniqueItems) ignored
    # and the rest (its items' type, no other key) enforced.
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    tools = [strict, {"type": "function", "function": {"name": "tag", "parameters": UNIQUE}}]
    grammar = await _grammar(_Tokenizer(QWEN, call_start="<tool_call>"), None, tools,
                             **({"forced": forced} if forced is not None else {}))
    assert grammar is not None and grammar.calls is not None
    opened = forced is None
    assert _takes(tiny_loaded, grammar.calls, opened, "get_weather", {"city": "Oslo"})
    assert not _takes(tiny_loaded, grammar.calls, opened, "get_weather", {"city": "Oslo", "days": 2})
    assert _takes(tiny_loaded, grammar.calls, opened, "tag", {"tags": ["a", "a"]})
    assert not _takes(tiny_loaded, grammar.calls, opened, "tag", {"tags": [1]})
    assert not _takes(tiny_loaded, grammar.calls, opened, "tag", {"tags": [], "more": 1})


@pytest.mark.anyio
async def test_a_json_schema_format_without_a_schema_asks_for_an_object_as_json_object() -> None:
    # It compiled as any JSON value: one demo reply in three was a bare JSON string where clients parse an object.
    plain = _Tokenizer({"a": 1})
    named_only = await _grammar(plain, {"type": "json_schema", "json_schema": {"name": "x"}})
    as_object = await _grammar(plain, {"type": "json_object"})
    assert named_only is not None and as_object is not None and named_only.text == as_object.text
    any_value = await _grammar(plain, {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})
    assert any_value is not None and any_value.text != as_object.text  # an explicit {} stays any JSON value
