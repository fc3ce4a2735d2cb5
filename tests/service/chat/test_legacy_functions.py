"""OpenAI's legacy function calling (`functions`, `function_call`, `role: "function"`), as Dify's OpenAI-API-compatible
plugin sends it in its "Function Call" mode and older LangChain chains do: taken as tools, the reply's call in the
legacy shape — `message.function_call`, streamed `delta.function_call`, finish_reason "function_call" — as the
openai SDK parses it. It was a 400 for every such request."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.chat.legacy_functions import legacy_call_id, with_legacy_calls
from service.chat.schemas import ChatMessage, FunctionCall
from service.state import AppState
from tests.service.chat.test_routes import CallingTokenizer
from tests.service.fake_engine import FakeEngine, rendered_prompt

FUNCTION = {"name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
FUNCTIONS = [FUNCTION]
TOOLS = [{"type": "function", "function": FUNCTION}]
ARGUMENTS = '{"city": "Paris"}'
# The model's call, one engine delta a piece, then a second call a legacy reply never carries.
PIECES = ["<tool_call>", '\n{"name": "get_weather", ', '"arguments": ', '{"city": ', '"Paris"}', "}\n</tool_call>"]
SECOND = ['\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>']
USER = {"role": "user", "content": "Weather in Paris?"}
# Dify's second turn in Function Call mode: its call back with empty content, the result as a function message.
DIFY_TURN = [
    {"role": "system", "content": "You are helpful."},
    USER,
    {"role": "assistant", "content": "", "function_call": {"name": "get_weather", "arguments": ARGUMENTS}},
    {"role": "function", "content": "sunny, 21 C", "name": "get_weather"},
]


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine([*PIECES, *SECOND], context_length=4096)
    engine.tokenizer = CallingTokenizer()
    return engine


def test_a_reply_to_functions_is_one_function_call_as_the_sdk_reads_it(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(model="fake-model", messages=[USER], functions=FUNCTIONS)
    (choice,) = completion.choices
    assert choice.finish_reason == "function_call"
    call = choice.message.function_call
    assert call is not None and (call.name, call.arguments) == ("get_weather", ARGUMENTS)
    # no tool_calls beside it, and the second call the model wrote is not a second function_call
    assert choice.message.tool_calls is None and choice.message.content is None


def test_a_streamed_function_call_sends_its_name_then_its_arguments(sdk: openai.OpenAI,
                                                                    http: TestClient[Any]) -> None:
    chunks = list(sdk.chat.completions.create(model="fake-model", messages=[USER], functions=FUNCTIONS,
                                              stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    first = deltas[0]
    assert first.role == "assistant" and first.content is None and first.tool_calls is None
    assert first.function_call is not None and (first.function_call.name, first.function_call.arguments) == \
        ("get_weather", "")
    fragments = [d.function_call.arguments for d in deltas[1:] if d.function_call is not None]
    assert "".join(f or "" for f in fragments) == ARGUMENTS and len(fragments) > 1  # streamed as written
    assert all(d.function_call is None or d.function_call.name is None for d in deltas[1:])
    assert all(d.tool_calls is None for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "function_call"
    # as OpenAI opens a call's stream: the role with content null in the call's own chunk
    raw = http.post("/v1/chat/completions", json={"messages": [USER], "functions": FUNCTIONS, "stream": True}).text
    assert raw.split("\n\n")[0].count('"role":"assistant","content":null,"function_call":{"name":"get_weather"') == 1


def test_difys_three_turn_conversation_renders_as_the_same_tool_history(hermes_tokenizer: Any) -> None:
    # Hermes' template renders calls and their results itself: the legacy turn reads exactly as a tools one.
    legacy = rendered_prompt(hermes_tokenizer, {"messages": DIFY_TURN, "functions": FUNCTIONS})
    modern = rendered_prompt(hermes_tokenizer, {"messages": [
        *DIFY_TURN[:2],
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}], "tools": TOOLS})
    assert legacy == modern
    assert '<tool_call>\n{"name": "get_weather"}\n</tool_call>' in legacy  # the fixture's template writes the name
    assert "<|im_start|>tool\nsunny, 21 C" in legacy


def test_difys_third_turn_is_answered(sdk: openai.OpenAI, engine: FakeEngine) -> None:
    engine.pieces = ["It is ", "sunny."]
    completion = sdk.chat.completions.create(model="fake-model", messages=DIFY_TURN, functions=FUNCTIONS)
    (choice,) = completion.choices
    assert (choice.message.content, choice.finish_reason) == ("It is sunny.", "stop")
    assert choice.message.function_call is None
    # the template got the call and its result paired by one id, as a tools history (not the reply's probe)
    (rendered,) = [c for c in engine.tokenizer.template_calls if len(c["messages"]) == len(DIFY_TURN)]
    messages = rendered["messages"]
    (call,) = messages[2]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert messages[3]["role"] == "tool" and messages[3]["tool_call_id"] == call["id"]
    assert rendered["tools"] == TOOLS


def test_a_function_result_answers_the_latest_unanswered_call_of_its_name() -> None:
    messages = [ChatMessage.model_validate(m) for m in [
        USER, {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}},
        {"role": "function", "name": "get_weather", "content": "rain"}, {"role": "user", "content": "And now?"},
        {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}},
        {"role": "function", "name": "get_weather", "content": "sun"}]]
    out = with_legacy_calls(messages)
    first, second = out[1].tool_calls, out[4].tool_calls
    assert first and second and first[0].id != second[0].id  # the same call at another turn: another id
    assert (out[2].role, out[2].tool_call_id, out[5].role, out[5].tool_call_id) == \
        ("tool", first[0].id, "tool", second[0].id)
    # made up the same way every turn (the prefix cache sees the same prompt)
    assert [m.tool_call_id for m in with_legacy_calls(messages)] == [m.tool_call_id for m in out]
    assert first[0].id == legacy_call_id(1, FunctionCall(name="get_weather", arguments="{}"))
    assert messages[1].tool_calls is None and messages[2].role == "function"  # the input stays as it was


def test_function_call_forces_the_named_function(sdk: openai.OpenAI, engine: FakeEngine) -> None:
    other = {"name": "get_time", "parameters": {"type": "object"}}
    completion = sdk.chat.completions.create(model="fake-model", messages=[USER], functions=[FUNCTION, other],
                                             function_call={"name": "get_weather"})
    assert engine.requests[-1].sampling.grammar is not None  # the call is enforced, as a named tool_choice's
    call = completion.choices[0].message.function_call
    assert call is not None and call.name == "get_weather" and completion.choices[0].finish_reason == "function_call"


def test_function_call_none_leaves_the_functions_out(http: TestClient[Any], engine: FakeEngine) -> None:
    engine.pieces = ["Sunny."]
    response = http.post("/v1/chat/completions", json={"messages": [USER], "functions": FUNCTIONS,
                                                       "function_call": "none"})
    assert response.status_code == 200, response.text
    calls = engine.tokenizer.template_calls
    assert calls and all(c["tools"] is None for c in calls)
    assert response.json()["choices"][0]["message"] == {"role": "assistant", "content": "Sunny."}


def test_n_and_logprobs_work_as_with_tools(http: TestClient[Any]) -> None:
    def choices(**body: Any) -> list[dict[str, Any]]:
        response = http.post("/v1/chat/completions", json={"messages": [USER], "n": 2, "logprobs": True, **body})
        assert response.status_code == 200, response.text
        return list(response.json()["choices"])

    # legacy replies had no parallel calls: the same as one call of tools
    legacy, modern = choices(functions=FUNCTIONS), choices(tools=TOOLS, parallel_tool_calls=False)
    for old, new in zip(legacy, modern, strict=True):
        (call,) = new["message"]["tool_calls"]
        assert old["message"]["function_call"] == call["function"] and "tool_calls" not in old["message"]
        assert old["logprobs"] == new["logprobs"] and old["logprobs"]["content"]
        assert (old["finish_reason"], new["finish_reason"]) == ("function_call", "tool_calls")


@pytest.mark.parametrize("body, param, words", [
    ({"functions": FUNCTIONS, "tools": TOOLS}, "functions", "'functions' and 'tools' cannot both be provided"),
    ({"tools": TOOLS, "tool_choice": "auto", "function_call": "auto"}, "function_call",
     "only allowed when 'functions'"),
    ({"functions": FUNCTIONS, "tool_choice": "auto", "function_call": "auto"}, "function_call",
     "'function_call' and 'tool_choice' cannot both be provided"),
    ({"function_call": "auto"}, "function_call", "only allowed when 'functions'"),
    # a key the object does not take: said so, not the other branch's "Input should be 'none' or 'auto'"
    ({"functions": FUNCTIONS, "function_call": {"name": "get_weather", "arguments": "{}"}}, "function_call",
     "'arguments' is not supported"),
    ({"functions": FUNCTIONS, "function_call": {"name": "get_time"}}, "function_call", "which functions does not"),
    ({"functions": FUNCTIONS, "messages": [USER, {"role": "function", "name": "get_weather", "content": "sun"}]},
     "messages.1.role", "must be a response to a preceding assistant message with 'function_call'"),
    ({"functions": FUNCTIONS, "messages": [*DIFY_TURN[:3], {"role": "function", "name": "get_time", "content": "9"}]},
     "messages.3.role", "no call of function 'get_time'"),
    ({"functions": FUNCTIONS, "messages": [*DIFY_TURN[:3], USER]}, "messages.2.function_call",
     "followed by a message with role 'function'"),
    ({"functions": FUNCTIONS, "messages": [*DIFY_TURN[:3], {"role": "function", "content": "sun"}]},
     "messages.3.name", "names the function"),
    # a tool_call_id on a function message was replaced by the made-up id, unread
    ({"functions": FUNCTIONS, "messages": [*DIFY_TURN[:3], {**DIFY_TURN[3], "tool_call_id": "zzz"}]},
     "messages.3.tool_call_id", "has no tool_call_id"),
    ({"functions": FUNCTIONS, "messages": DIFY_TURN[:3], "continue_final_message": True,
      "add_generation_prompt": False}, "continue_final_message", "the last message has a function_call"),
])
def test_legacy_fields_that_cannot_be_honoured_are_400s_naming_them(http: TestClient[Any], body: dict[str, Any],
                                                                    param: str, words: str) -> None:
    response = http.post("/v1/chat/completions", json={"messages": [USER], **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_forced_function_the_model_cannot_be_held_to_names_function_call() -> None:
    # A model without <tool_call> JSON markers (the plain fake tokenizer) takes no forced call: refused by the field
    # the client sent, not by the tool_choice it became.
    with TestClient(create_app(AppState(engine=FakeEngine(["ok"])))) as client:
        response = client.post("/v1/chat/completions", json={"messages": [USER], "functions": FUNCTIONS,
                                                              "function_call": {"name": "get_weather"}})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "function_call"
