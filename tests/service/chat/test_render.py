"""service/chat/render.py with the routes: tools reach a model whose template takes none (described in the system
message, calls parsed as <tool_call> JSON), tool_choice "none" and parallel_tool_calls false are honoured, and
reasoning_effort maps onto what the template reads or is refused."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient
from mlx_lm.tool_parsers import json_tools

from service.app import create_app
from service.state import AppState
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine, FakeTokenizer

USER = [{"role": "user", "content": "weather?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
SECOND = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


class TemplateTokenizer(FakeTokenizer):
    """The fake tokenizer with a real chat-template source (what the server reads variables from) and, when
    asked, a model family's tool-call markers and thinking markers."""

    def __init__(self, template: str, *, markers: bool = False, thinks: bool = False) -> None:
        super().__init__()
        self.chat_template = template
        if markers:
            self.tool_call_start, self.tool_call_end = json_tools.tool_call_start, json_tools.tool_call_end
            self.tool_parser = json_tools.parse_tool_call
        if thinks:
            self.think_start, self.think_end = "<think>", "</think>"


PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"
WITH_TOOLS = "{% if tools %}{{ tools | tojson }}{% endif %}" + PLAIN
WITH_SWITCH = "{% if enable_thinking %}think{% endif %}" + PLAIN
WITH_EFFORT = "Reasoning: {{ reasoning_effort }}" + PLAIN


def _client(tokenizer: FakeTokenizer, pieces: list[str]) -> Iterator[tuple[TestClient[Any], FakeEngine]]:
    engine = FakeEngine(pieces, context_length=4096)
    engine.tokenizer = tokenizer
    with TestClient(create_app(AppState(engine=engine))) as client:
        yield client, engine


@pytest.fixture
def plain_model() -> Iterator[tuple[TestClient[Any], FakeEngine]]:
    yield from _client(TemplateTokenizer(PLAIN), ["I will check. ", CALL])


def _chat(client: TestClient[Any], **body: Any) -> Any:
    response = client.post("/v1/chat/completions", json={"messages": USER, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_template_without_tools_gets_them_in_the_system_message_and_calls_are_parsed(plain_model) -> None:
    client, engine = plain_model
    reply = _chat(client, tools=TOOLS, messages=[{"role": "system", "content": "Be brief."}, *USER])
    call = engine.tokenizer.template_calls[0]
    assert call["tools"] is None
    system = call["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in system["content"] and "<tool_call>" in system["content"]
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "I will check. "
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "get_weather"
    assert json.loads(tool_call["function"]["arguments"]) == {"city": "Paris"}
    # Without a system message one is added first; without tools nothing is.
    _chat(client, tools=TOOLS)
    assert engine.tokenizer.template_calls[-1]["messages"][0]["content"].startswith("# Tools")
    plain = _chat(client)
    assert engine.tokenizer.template_calls[-1]["messages"] == [{"role": "user", "content": "weather?"}]
    assert plain["choices"][0]["message"]["content"] == "I will check. " + CALL  # no tools: no call parsing


def test_a_template_with_tools_renders_them_itself() -> None:
    for client, engine in _client(TemplateTokenizer(WITH_TOOLS, markers=True), ["ok"]):
        _chat(client, tools=TOOLS)
        call = engine.tokenizer.template_calls[0]
        assert call["tools"] == TOOLS and call["messages"] == [{"role": "user", "content": "weather?"}]


def test_without_a_template_tools_are_described_in_a_system_line_and_calls_are_parsed() -> None:
    tokenizer = FakeTokenizer()
    tokenizer.has_chat_template = False  # mlx-lm's plain "role: content" lines
    for client, engine in _client(tokenizer, ["I will check. ", CALL]):
        choice = _chat(client, tools=TOOLS)["choices"][0]
        prompt = tokenizer.decode(engine.requests[-1].prompt_tokens)
        assert prompt.startswith("system: # Tools") and json.dumps(TOOLS[0]) in prompt
        assert prompt.endswith("user: weather?\nassistant: ")
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "I will check. "
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]


REFUSES_SYSTEM = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}" \
                 "{% endif %}" + PLAIN


class RefusesSystemTokenizer(TemplateTokenizer):
    """A Gemma-style template: a system turn is an error (the fake renders no jinja, so it raises itself)."""

    def __init__(self) -> None:
        super().__init__(REFUSES_SYSTEM)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, *, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        if messages and messages[0]["role"] == "system":
            raise ValueError("System role not supported")
        return super().apply_chat_template(messages, tools, tokenize=tokenize, **kwargs)


def test_a_template_that_refuses_our_system_turn_gets_the_tools_in_the_first_user_turn() -> None:
    for client, engine in _client(RefusesSystemTokenizer(), ["I will check. ", CALL]):
        choice = _chat(client, tools=TOOLS)["choices"][0]
        (user,) = engine.tokenizer.template_calls[-1]["messages"]
        assert user["role"] == "user" and user["content"].startswith("# Tools")
        assert json.dumps(TOOLS[0]) in user["content"] and user["content"].endswith("</tool_call>\n\nweather?")
        assert choice["finish_reason"] == "tool_calls"
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]


def test_a_system_message_the_template_refuses_is_still_the_clients_error() -> None:
    for client, engine in _client(RefusesSystemTokenizer(), ["ok"]):
        response = client.post("/v1/chat/completions", json={
            "messages": [{"role": "system", "content": "Be brief."}, *USER], "tools": TOOLS})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "invalid_messages" and "System role not supported" in error["message"]
        assert not engine.requests


ROUND_TRIP = [
    *USER,
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "noon"},
]
WITH_CALLS = "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.name }}" \
             "{% endfor %}{% endfor %}"


@pytest.mark.parametrize("tools", [TOOLS, [], None])
def test_earlier_calls_and_results_reach_a_template_that_does_not_render_calls(plain_model, tools) -> None:
    # An agent's next turn (pi sends `tools: []` with its history too): the calls were the template's to drop.
    client, engine = plain_model
    _chat(client, messages=ROUND_TRIP, **({} if tools is None else {"tools": tools}))
    # The conversation's rendering (with tools a system-block probe follows it).
    messages = max((c["messages"] for c in engine.tokenizer.template_calls), key=len)
    assistant, results = messages[-2:]
    assert assistant["role"] == "assistant" and "tool_calls" not in assistant
    assert assistant["content"] == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                                    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert results == {"role": "user", "content": "<tool_response>\nSunny\n</tool_response>\n"
                                                  "<tool_response>\nnoon\n</tool_response>"}


def test_without_a_template_the_calls_are_written_as_text_too() -> None:
    tokenizer = FakeTokenizer()
    tokenizer.has_chat_template = False  # mlx-lm's plain "role: content" lines
    for client, engine in _client(tokenizer, ["ok"]):
        _chat(client, messages=ROUND_TRIP)
        prompt = tokenizer.decode(engine.requests[-1].prompt_tokens)
        assert '"name": "get_weather", "arguments": {"city": "Paris"}' in prompt
        assert "user: <tool_response>\nSunny\n</tool_response>" in prompt and "tool:" not in prompt


def test_a_template_that_renders_calls_gets_them_as_they_came() -> None:
    for client, engine in _client(TemplateTokenizer(WITH_CALLS), ["ok"]):
        _chat(client, messages=ROUND_TRIP)
        messages = engine.tokenizer.template_calls[-1]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
        assert [c["function"]["name"] for c in messages[1]["tool_calls"]] == ["get_weather", "get_time"]


REVERSED = [*ROUND_TRIP[:2], ROUND_TRIP[3], ROUND_TRIP[2]]  # valid for OpenAI: results pair with calls by id


def test_results_sent_out_of_order_reach_the_template_in_the_order_of_their_calls(plain_model) -> None:
    for client, engine in _client(TemplateTokenizer(WITH_CALLS), ["ok"]):
        _chat(client, messages=REVERSED)
        messages = engine.tokenizer.template_calls[-1]["messages"]
        assert [(m["role"], m.get("tool_call_id")) for m in messages[2:]] == [("tool", "c1"), ("tool", "c2")]
    # As text (<tool_response> blocks carry no id): each in its call's place.
    client, engine = plain_model
    _chat(client, messages=REVERSED)
    assert engine.tokenizer.template_calls[-1]["messages"][-1]["content"] == (
        "<tool_response>\nSunny\n</tool_response>\n<tool_response>\nnoon\n</tool_response>")


@pytest.mark.parametrize("messages, param, words", [
    ([*ROUND_TRIP[:3], {"role": "tool", "tool_call_id": "c9", "content": "noon"}], "messages.3.tool_call_id",
     "'tool_call_id' of 'c9' not found in 'tool_calls' of previous message"),
    ([*USER, {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}], "messages.1.tool_call_id",
     "must be a response to a preceding message with 'tool_calls'"),
    (ROUND_TRIP[:3], "messages.1.tool_calls", "did not have response messages: c2"),
])
def test_tool_results_that_answer_no_call_or_calls_left_unanswered_are_refused(plain_model, messages, param,
                                                                               words) -> None:
    client, engine = plain_model
    response = client.post("/v1/chat/completions", json={"messages": messages})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value") and words in error["message"]
    assert not engine.requests


class NamesTokenizer(TemplateTokenizer):
    """A Kimi-style template that writes the speaker's name in place of the role (the fake renders no jinja)."""

    def __init__(self) -> None:
        super().__init__("{% for m in messages %}{{ m.get('name') or m.role }}{{ m.content }}{% endfor %}")

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, *, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        named = [dict(m, role=m.get("name") or m["role"]) for m in messages]
        rendered = super().apply_chat_template(named, tools, tokenize=tokenize, **kwargs)
        if self.template_calls and self.template_calls[-1]["messages"] == named:
            self.template_calls[-1]["messages"] = messages  # recorded as they came
        return rendered


NAMED = [{"role": "system", "content": "Be brief.", "name": "rules"},
         {"role": "user", "content": "hi", "name": "alice"}]


def _conversation(engine: FakeEngine) -> list[dict[str, Any]]:
    # The conversation's rendering, not the system-block probe after it (an empty user turn).
    return next(c["messages"] for c in reversed(engine.tokenizer.template_calls) if c["messages"][-1]["content"])


def test_a_name_the_template_does_not_write_opens_the_message(plain_model) -> None:
    client, engine = plain_model
    _chat(client, messages=NAMED)
    assert [m["content"] for m in _conversation(engine)] == ["rules: Be brief.", "alice: hi"]
    for client, engine in _client(NamesTokenizer(), ["ok"]):
        _chat(client, messages=NAMED)
        assert _conversation(engine) == NAMED  # the template writes them itself


def test_tool_choice_none_shows_no_tools_and_parses_no_calls() -> None:
    for client, engine in _client(TemplateTokenizer(WITH_TOOLS, markers=True), ["I will check. ", CALL]):
        reply = _chat(client, tools=TOOLS, tool_choice="none")
        assert engine.tokenizer.template_calls[0]["tools"] is None
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
        assert choice["message"]["content"] == "I will check. " + CALL
        with_auto = _chat(client, tools=TOOLS, tool_choice="auto")["choices"][0]
        assert with_auto["finish_reason"] == "tool_calls"


def test_parallel_tool_calls_false_ends_the_reply_after_the_first_call() -> None:
    pieces = [CALL, SECOND, " and more text", " that never comes"]
    for client, engine in _client(TemplateTokenizer(WITH_TOOLS, markers=True), pieces):
        both = _chat(client, tools=TOOLS)["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in both] == ["get_weather", "get_time"]
        closed = engine.closed_streams
        reply = _chat(client, tools=TOOLS, parallel_tool_calls=False)
        one = reply["choices"][0]
        assert one["finish_reason"] == "tool_calls"
        assert reply["usage"]["completion_tokens"] == 1  # stopped as its first call ended: no second one generated
        assert [c["function"]["name"] for c in one["message"]["tool_calls"]] == ["get_weather"]
        assert engine.closed_streams == closed + 1  # the row was stopped, not read to its end
        events = sse_events(client.post("/v1/chat/completions", json={
            "messages": USER, "tools": TOOLS, "parallel_tool_calls": False, "stream": True}).text)
        assert events[-1] == "[DONE]"
        names = [c["function"].get("name") for e in events[:-1] for c in e["choices"][0]["delta"].get("tool_calls", [])]
        assert [n for n in names if n] == ["get_weather"]
        assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"][0]["finish_reason"]] == ["tool_calls"]


def test_a_named_tool_choice_ends_the_reply_after_its_call() -> None:
    # LangChain's bind_tools(tool_choice="get_weather"): the model wrote the call twice, and a small max_tokens cut the
    # second into a call with empty arguments. vLLM's named choice is one call; "required" may make several.
    named = {"type": "function", "function": {"name": "get_weather"}}
    for client, engine in _client(TemplateTokenizer(WITH_TOOLS, markers=True), [CALL, CALL, " more"]):
        one = _chat(client, tools=TOOLS, tool_choice=named)["choices"][0]
        assert one["finish_reason"] == "tool_calls" and len(one["message"]["tool_calls"]) == 1
        events = sse_events(client.post("/v1/chat/completions", json={
            "messages": USER, "tools": TOOLS, "tool_choice": named, "stream": True}).text)
        assert [c["index"] for e in events[:-1] for c in e["choices"][0]["delta"].get("tool_calls", [])] == [0, 0]
        assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"][0]["finish_reason"]] == [
            "tool_calls"]
        assert len(_chat(client, tools=TOOLS, tool_choice="required")["choices"][0]["message"]["tool_calls"]) == 2
        # /v1/responses and /v1/messages name their function as chat does
        output = client.post("/v1/responses", json={"input": "weather?", "tool_choice": named["function"] | {
            "type": "function"}, "tools": [{"type": "function", **TOOLS[0]["function"]}]}).json()["output"]
        content = client.post("/v1/messages", json={
            "model": "fake-model", "max_tokens": 50, "messages": USER,
            "tools": [{"name": "get_weather", "input_schema": {}}],
            "tool_choice": {"type": "tool", "name": "get_weather"}}).json()
        assert [o["type"] for o in output] == ["function_call"]
        assert [c["type"] for c in content["content"]] == ["tool_use"] and content["stop_reason"] == "tool_use"


@pytest.mark.parametrize("template, thinks, effort, expected", [
    (WITH_SWITCH, False, "low", {"enable_thinking": True}),
    (WITH_SWITCH, True, "none", {"enable_thinking": False}),
    (WITH_EFFORT, False, "high", {"reasoning_effort": "high"}),
    (PLAIN, False, "none", {}),  # nothing thinks: off already
    (PLAIN, True, "medium", {}),  # it always thinks
])
def test_reasoning_effort_sets_what_the_template_reads(template: str, thinks: bool, effort: str,
                                                       expected: dict[str, Any]) -> None:
    for client, engine in _client(TemplateTokenizer(template, thinks=thinks), ["ok"]):
        _chat(client, reasoning_effort=effort)
        call = engine.tokenizer.template_calls[0]
        assert {k: call[k] for k in ("enable_thinking", "reasoning_effort") if k in call} == expected


@pytest.mark.parametrize("thinks, effort, words, code", [
    # OpenAI's codes (simple-evals and Inspect probe with reasoning_effort): no such parameter for a model without
    # reasoning, an unsupported value for one that reasons
    (False, "high", "does not reason", "unsupported_parameter"),
    (True, "none", "no switch to turn that off", "unsupported_value")])
def test_reasoning_effort_that_cannot_be_had_is_refused(thinks: bool, effort: str, words: str, code: str) -> None:
    for client, engine in _client(TemplateTokenizer(PLAIN, thinks=thinks), ["ok"]):
        response = client.post("/v1/chat/completions", json={"messages": USER, "reasoning_effort": effort})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "reasoning_effort" and words in error["message"] and error["code"] == code
        assert not engine.requests
        refused = client.post("/v1/responses", json={"input": "hi", "reasoning": {"effort": effort}}).json()["error"]
        assert refused["param"] == "reasoning.effort" and refused["code"] == code, refused


class BracketThinkTokenizer(TemplateTokenizer):
    """A Magistral-like model: [THINK] markers in its vocabulary (mlx-lm finds none), a template with no switch."""

    def get_vocab(self) -> dict[str, int]:
        return {**super().get_vocab(), "[THINK]": self.vocab, "[/THINK]": self.vocab + 1}


def test_a_model_thinking_in_bracket_markers_takes_an_effort() -> None:
    # It answered "this model does not reason" though its template has it think in [THINK] blocks.
    for client, engine in _client(BracketThinkTokenizer(PLAIN), ["ok"]):
        low = client.post("/v1/chat/completions", json={"messages": USER, "reasoning_effort": "low"})
        assert low.status_code == 200
        response = client.post("/v1/chat/completions", json={"messages": USER, "reasoning_effort": "none"})
        assert response.status_code == 400 and "no switch to turn that off" in response.json()["error"]["message"]


DESCRIBES = "{% for t in tools %}{{ t.function.description | trim }}{% endfor %}" + PLAIN


@pytest.mark.parametrize("template, described", [(DESCRIBES, True), (WITH_TOOLS, False)])
def test_a_tool_without_a_description_gets_an_empty_one_where_the_template_writes_descriptions(
        template: str, described: bool) -> None:
    # Hermes' template failed on a tool without one (optional in OpenAI's API): a 400 naming `messages`.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for client, engine in _client(TemplateTokenizer(template, markers=True), ["ok"]):
        assert client.post("/v1/chat/completions", json={"messages": USER, "tools": tools}).status_code == 200
        (tool,) = engine.tokenizer.template_calls[-1]["tools"]
        assert ("description" in tool["function"]) is described
