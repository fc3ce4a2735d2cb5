"""POST /v1/messages and /v1/messages/count_tokens against a scripted engine (and the tiny model): the Message and
its content blocks, the stream's exact event order, a tool round trip through a real tool-calling template, stop
sequences, errors in Anthropic's shape before and after the headers."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from engine.runtime import Engine
from service.app import create_app
from service.config import ServiceConfig
from service.state import AppState
from tests.service.chat.test_routes import CALL, CallingTokenizer
from tests.service.sse_events import named_events as message_events
from tests.service.fake_engine import FakeEngine

TOOLS = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": {"type": "object"}}]
USER = [{"role": "user", "content": "weather?"}]
THINK_TEXT_CALL = ["<think>", "hmm", "</think>", "Sunny ", "today.", CALL]


def _client(engine: FakeEngine, state: AppState | None = None) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(state or AppState(engine=engine))) as client:
        yield client


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine(list(THINK_TEXT_CALL))
    engine.tokenizer = CallingTokenizer()
    return engine


@pytest.fixture
def http(engine: FakeEngine) -> Iterator[TestClient[Any]]:
    yield from _client(engine)


def _post(http: TestClient[Any], path: str = "/v1/messages", **fields: Any) -> Any:
    return http.post(path, json={"model": "fake-model", "max_tokens": 64, "messages": USER, **fields})


def test_a_reply_names_the_served_model_whatever_name_asked_for_it(client: TestClient[Any]) -> None:
    # "demo" (or TGI's "tgi") was echoed back where chat and Anthropic answer the id of the model that replied.
    for streamed in (False, True):
        response = client.post("/v1/messages", json={"model": "tgi", "max_tokens": 8, "messages": USER,
                                                     "stream": streamed})
        assert response.status_code == 200, response.text
        assert '"model":"fake-model"' in response.text.replace(" ", "") and '"tgi"' not in response.text


def test_a_text_reply_is_one_text_block(fake_engine: FakeEngine, client: TestClient[Any]) -> None:
    response = _post(client)
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["id"].startswith("msg_") and message["type"] == "message" and message["role"] == "assistant"
    assert message["model"] == "fake-model"
    assert message["content"] == [{"type": "text", "text": "Hello world!"}]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None
    prompt = len(fake_engine.requests[-1].prompt_tokens)
    assert message["usage"] == {"input_tokens": prompt, "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 0, "output_tokens": 5, "service_tier": "standard"}


def test_cached_prompt_tokens_are_cache_reads(fake_engine: FakeEngine, client: TestClient[Any]) -> None:
    fake_engine.cached_tokens, fake_engine.cache_write_tokens = 4, 6
    usage = _post(client).json()["usage"]
    prompt = len(fake_engine.requests[-1].prompt_tokens)
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (prompt - 4, 4)
    # the writes are known only at the reply's end, after message_start split the input: they stay in input_tokens
    assert usage["cache_creation_input_tokens"] == 0


def test_a_streamed_text_reply_has_anthropics_event_order(client: TestClient[Any]) -> None:
    response = _post(client, stream=True)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = message_events(response.text)
    assert [e["type"] for e in events] == ["message_start", "content_block_start"] + ["content_block_delta"] * 5 + [
        "content_block_stop", "message_delta", "message_stop"]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    assert events[1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert "".join(e["delta"]["text"] for e in events[2:7]) == "Hello world!"
    assert all(e["index"] == 0 and e["delta"]["type"] == "text_delta" for e in events[2:7])
    assert events[7] == {"type": "content_block_stop", "index": 0}
    assert events[8]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[8]["usage"]["output_tokens"] == 5


def test_thinking_text_and_a_call_are_three_blocks_streamed_or_not(http: TestClient[Any]) -> None:
    message = _post(http, tools=TOOLS).json()
    thinking, text, call = message["content"]
    assert thinking == {"type": "thinking", "thinking": "hmm", "signature": ""}
    assert text == {"type": "text", "text": "Sunny today."}
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_") and call["name"] == "get_weather"
    assert call["input"] == {"city": "Paris"} and message["stop_reason"] == "tool_use"
    events = message_events(_post(http, tools=TOOLS, stream=True).text)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    deltas = {e["delta"]["type"] for e in events if e["type"] == "content_block_delta"}
    assert deltas == {"thinking_delta", "text_delta", "input_json_delta"}
    arguments = "".join(e["delta"]["partial_json"] for e in events
                        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert json.loads(arguments) == {"city": "Paris"}
    # Every block's events fall between its start and its stop, blocks one after another.
    open_index: int | None = None
    for event in events[1:-2]:
        if event["type"] == "content_block_start":
            assert open_index is None
            open_index = event["index"]
        elif event["type"] == "content_block_stop":
            assert event["index"] == open_index
            open_index = None
        else:
            assert event["index"] == open_index
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_the_sdk_stream_helper_assembles_the_non_streamed_message(http: TestClient[Any]) -> None:
    anthropic = pytest.importorskip("anthropic")
    try:
        sdk = anthropic.Anthropic(base_url=str(http.base_url), api_key="unused", http_client=http, max_retries=0)
    except TypeError:
        pytest.skip("this anthropic SDK takes no httpx client")
    whole = sdk.messages.create(model="fake-model", max_tokens=64, messages=USER, tools=TOOLS)
    with sdk.messages.stream(model="fake-model", max_tokens=64, messages=USER, tools=TOOLS) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == whole.content[2].input == {"city": "Paris"}
    assert final.stop_reason == whole.stop_reason == "tool_use" and final.usage.output_tokens == 6
    assert sdk.messages.count_tokens(model="fake-model", messages=USER).input_tokens > 0


def test_a_tool_round_trip_through_a_tool_use_template(hermes_tokenizer: Any) -> None:
    # Hermes' `tool_use` template: the call comes back as a tool_use block, its result goes to the template as a
    # tool turn it renders itself.
    engine = FakeEngine(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'],
                        context_length=4096)
    engine.tokenizer = hermes_tokenizer
    for http in _client(engine):
        first = _post(http, tools=TOOLS).json()
        (call,) = first["content"]
        assert call["type"] == "tool_use" and call["input"] == {"city": "Paris"} and first["stop_reason"] == "tool_use"
        history = [*USER, {"role": "assistant", "content": first["content"]}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "sunny"}]},
            {"type": "text", "text": "And tomorrow?"}]}]
        assert _post(http, tools=TOOLS, messages=history).status_code == 200
    prompt = hermes_tokenizer.decode(engine.requests[-1].prompt_tokens)
    assert '<tool_call>\n{"name": "get_weather"}\n</tool_call>' in prompt  # the call, written by the template
    assert "<|im_start|>tool\nsunny<|im_end|>" in prompt and "<|im_start|>user\nAnd tomorrow?" in prompt
    assert prompt.index("tool\nsunny") < prompt.index("And tomorrow?")


# A template that takes tools and renders calls, results and earlier reasoning itself.
READS_ALL = ("{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}<{{ m.role }}>"
             "{{ m.reasoning_content }}{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.id }}{% endfor %}"
             "{% endfor %}")


def test_an_error_result_says_so_and_earlier_thinking_goes_back_to_the_template() -> None:
    from tests.service.chat.test_render import TemplateTokenizer

    engine = FakeEngine(["ok"])
    engine.tokenizer = TemplateTokenizer(READS_ALL, markers=True, thinks=True)
    history = [*USER, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "look it up", "signature": "x"}, {"type": "redacted_thinking", "data": "?"},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "no network",
                                      "is_error": True, "cache_control": {"type": "ephemeral"}}]}]
    for http in _client(engine):
        assert _post(http, tools=TOOLS, messages=history, system=[
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]).status_code == 200
    # the prompt's render (the server also renders probes: its system block alone, the generation prompt)
    messages = max((call["messages"] for call in engine.tokenizer.template_calls), key=len)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[2]["reasoning_content"] == "look it up" and messages[2]["tool_calls"][0]["id"] == "toolu_1"
    assert messages[3]["role"] == "tool" and messages[3]["content"] == "Error: no network"


def test_thinking_sets_the_templates_switch() -> None:
    from tests.service.chat.test_render import WITH_EFFORT, WITH_SWITCH, TemplateTokenizer

    for template, kwarg, on, off in [(WITH_SWITCH, "enable_thinking", True, False),
                                     (WITH_EFFORT, "reasoning_effort", "high", "none")]:
        engine = FakeEngine(["ok"])
        engine.tokenizer = TemplateTokenizer(template, thinks=True)
        for http in _client(engine):
            assert _post(http, thinking={"type": "enabled", "budget_tokens": 31999}).status_code == 200
            assert engine.tokenizer.template_calls[-1][kwarg] == on
            assert _post(http, thinking={"type": "disabled"}).status_code == 200
            assert engine.tokenizer.template_calls[-1][kwarg] == off


def test_tool_choice_and_sampling_reach_the_chat_request(engine: FakeEngine, http: TestClient[Any]) -> None:
    response = _post(http, tools=TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True},
                     temperature=0.5, top_p=0.9, top_k=7, stop_sequences=["END"], metadata={"user_id": "u-1"})
    assert response.status_code == 200
    request = engine.requests[-1]
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.top_k) == (0.5, 0.9, 7)
    assert request.stop == ("END",) and request.max_tokens == 64


@pytest.mark.parametrize("fields, named", [
    ({"bogus": 1}, "bogus"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    ({"messages": [*USER, {"role": "assistant", "content": "The weather is "}]}, "trailing whitespace"),
    ({"messages": [*USER, {"role": "assistant", "content": " \n"}]}, "trailing whitespace"),
    ({"messages": [*USER, {"role": "assistant", "content": "The weather is"}],
      "thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
    ({"messages": [*USER, {"role": "assistant", "content": "The weather is"}], "thinking": {"type": "adaptive"}},
     "thinking"),
    ({"messages": [*USER, {"role": "assistant", "content": [
        {"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]}],
      "tools": TOOLS}, "messages.1.content.1"),
    ({"messages": [*USER, {"role": "assistant", "content": "The weather is"}], "tools": TOOLS,
      "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"thinking": {"type": "enabled"}}, "budget_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "y"}]},
                   *USER]}, "tool_result"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "y"}]}]},
     "messages"),
])
def test_what_cannot_be_honoured_is_a_400_in_anthropics_shape(http: TestClient[Any], fields: dict[str, Any],
                                                              named: str) -> None:
    response = _post(http, **fields)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert named in body["error"]["message"], body


@pytest.mark.parametrize("turns, where", [
    # a result answering another call, after a system prompt (chat counted it as message 0)
    ([*USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_A", "name": "get_weather",
                                                 "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_B", "content": "sunny"}]}],
     "messages.2.content.0"),
    # a result with no call before it, beside text
    ([{"role": "user", "content": [{"type": "text", "text": "hi"},
                                   {"type": "tool_result", "tool_use_id": "toolu_A", "content": "sunny"}]}],
     "messages.0.content.1"),
])
def test_a_tool_result_answering_no_call_is_named_in_anthropics_words(http: TestClient[Any], turns: list[Any],
                                                                       where: str) -> None:
    # It was "messages.3.tool_call_id: ... 'tool_calls' of previous message": chat's names, the index off by system.
    response = _post(http, system="Be brief.", tools=TOOLS, messages=turns)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(f"{where}: unexpected `tool_use_id`") and "tool_call" not in message, message


def test_an_unknown_model_is_a_not_found_error(client: TestClient[Any]) -> None:
    # As chat answers a name it does not serve (Claude Code is pointed at the served id by ANTHROPIC_MODEL).
    response = _post(client, model="claude-sonnet-4-5")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


def test_the_guards_refusals_are_in_anthropics_shape(fake_engine: FakeEngine) -> None:
    state = AppState(engine=fake_engine, config=ServiceConfig(api_keys=("sekrit",)))
    for http in _client(fake_engine, state):
        refused = _post(http)
        assert refused.status_code == 401
        assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "authentication_error"
        ok = http.post("/v1/messages", headers={"x-api-key": "sekrit", "anthropic-version": "2023-06-01",
                                                "anthropic-beta": "interleaved-thinking-2025-05-14"},
                       json={"model": "fake-model", "max_tokens": 8, "messages": USER})
        assert ok.status_code == 200, ok.text
        chat = http.post("/v1/chat/completions", json={"messages": USER})
        assert chat.json()["error"]["code"] == "invalid_api_key"  # other routes keep OpenAI's shape


def test_a_failure_after_the_headers_is_an_error_event_and_the_stream_ends(fake_engine: FakeEngine,
                                                                        client: TestClient[Any]) -> None:
    fake_engine.fail_with = "the device fell over"
    events = message_events(_post(client, stream=True).text)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "error"
    assert events[-1]["error"] == {"type": "api_error", "message": "the device fell over"}
    assert "message_stop" not in [e["type"] for e in events] and fake_engine.closed_streams >= 1
    fake_engine.fail_at = 0  # before the headers: a status, not an empty 200
    failed = _post(client)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "api_error"


PREFILL = [*USER, {"role": "assistant", "content": "The weather is"}]


def test_a_last_assistant_turn_is_a_prefill_the_reply_continues(fake_engine: FakeEngine,
                                                                client: TestClient[Any]) -> None:
    message = _post(client, messages=PREFILL).json()
    prompt = fake_engine.tokenizer.encode("<user>weather?<assistant>The weather is")
    assert fake_engine.requests[-1].prompt_tokens == prompt and fake_engine.requests[-1].continuation
    assert message["content"] == [{"type": "text", "text": "Hello world!"}]  # the continuation alone, as Anthropic's
    assert message["usage"]["input_tokens"] == len(prompt)
    events = message_events(_post(client, messages=PREFILL, stream=True).text)
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "Hello world!"
    counted = client.post("/v1/messages/count_tokens", json={"model": "fake-model", "messages": PREFILL})
    assert counted.json() == {"input_tokens": len(prompt)}
    # Thinking off is no extended thinking; an empty last assistant turn (Anthropic takes one) asks for no prefill.
    assert _post(client, messages=PREFILL, thinking={"type": "disabled"}).status_code == 200
    assert _post(client, messages=[*USER, {"role": "assistant", "content": ""}]).status_code == 200
    assert fake_engine.requests[-1].prompt_tokens == fake_engine.tokenizer.encode("<user>weather?<assistant>")


EMPTY = "all messages must have non-empty content except for the optional final assistant message"


@pytest.mark.parametrize("content", ["", []])
def test_only_the_final_assistant_turn_may_be_empty(fake_engine: FakeEngine, client: TestClient[Any],
                                                    content: Any) -> None:
    # `[]` was refused there ("give at least one content block") while "" was taken: Anthropic takes both.
    assert _post(client, messages=[*USER, {"role": "assistant", "content": content}]).status_code == 200
    assert fake_engine.requests[-1].prompt_tokens == fake_engine.tokenizer.encode("<user>weather?<assistant>")
    counted = client.post("/v1/messages/count_tokens", json={
        "model": "fake-model", "messages": [*USER, {"role": "assistant", "content": content}]})
    assert counted.status_code == 200, counted.text
    for turns, at in (([{"role": "user", "content": content}], 0),
                      ([*USER, {"role": "assistant", "content": content}, *USER], 1)):
        refused = _post(client, messages=turns)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == {"type": "invalid_request_error", "message": f"messages.{at}: {EMPTY}"}


def test_count_tokens_is_the_rendered_prompts_length(engine: FakeEngine, http: TestClient[Any]) -> None:
    body = {"model": "fake-model", "messages": USER, "tools": TOOLS, "system": "Be brief."}
    counted = http.post("/v1/messages/count_tokens", json=body)
    assert counted.status_code == 200, counted.text
    assert _post(http, **body).status_code == 200
    assert counted.json() == {"input_tokens": len(engine.requests[-1].prompt_tokens)}
    refused = http.post("/v1/messages/count_tokens", json={**body, "max_tokens": 5})
    assert refused.status_code == 400 and "max_tokens" in refused.json()["error"]["message"]


def test_the_tiny_model_answers_streamed_or_not_and_stops_at_a_stop_sequence(tiny_loaded: Any) -> None:
    state = AppState(engine=Engine(tiny_loaded, max_active=4))
    with TestClient(create_app(state)) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        body = {"model": model, "max_tokens": 24, "temperature": 0, "messages": [
            {"role": "user", "content": "Hello world! What is the answer?"}]}
        whole = http.post("/v1/messages", json=body).json()
        text = whole["content"][0]["text"]
        assert whole["stop_reason"] in ("end_turn", "max_tokens") and len(text) >= 8, whole
        events = message_events(http.post("/v1/messages", json={**body, "stream": True}).text)
        assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
        assert [e["type"] for e in events][-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == text
        stop = text[4:7]
        cut = http.post("/v1/messages", json={**body, "stop_sequences": ["never said", stop]}).json()
        assert (cut["stop_reason"], cut["stop_sequence"]) == ("stop_sequence", stop)
        assert cut["content"][0]["text"] == text[:text.index(stop)]


def test_a_forced_tool_not_marked_strict_is_called_whatever_its_input_schema(tiny_loaded: Any) -> None:
    # tool_choice {"type": "tool"} of a tool whose schema the engine cannot enforce ("float" is no JSON Schema type)
    # was a 400 naming tools.0.function.parameters; Anthropic does not enforce a schema not marked strict.
    schema = {"type": "object", "properties": {"x": {"type": "float"}}}
    with TestClient(create_app(AppState(engine=Engine(tiny_loaded, max_iteration_tokens=8)))) as http:
        body = {"model": http.get("/v1/models").json()["data"][0]["id"], "max_tokens": 200, "temperature": 0,
                "messages": USER, "tools": [{"name": "f", "input_schema": schema}],
                "tool_choice": {"type": "tool", "name": "f"}}
        reply = http.post("/v1/messages", json=body)
    assert reply.status_code == 200, reply.text
    use = next(block for block in reply.json()["content"] if block["type"] == "tool_use")
    assert use["name"] == "f" and isinstance(use["input"], dict), use


def test_a_failed_stream_gives_its_usage_before_the_error(fake_engine: FakeEngine, client: TestClient[Any]) -> None:
    # The error event ended it with no usage: a client metering by message_delta never saw the tokens it was shown.
    fake_engine.fail_with, fake_engine.fail_at = "the device fell over", 3
    events = message_events(_post(client, stream=True).text)
    delta, error = events[-2:]
    assert error["type"] == "error" and delta["type"] == "message_delta"
    # No stop_reason (the reply did not end), no block stopped (a cut call must not read as whole).
    assert delta["delta"] == {"stop_reason": None, "stop_sequence": None} and events[-3]["type"] == "content_block_delta"
    prompt = len(fake_engine.requests[-1].prompt_tokens)
    assert delta["usage"]["input_tokens"] == prompt and delta["usage"]["output_tokens"] >= 3

