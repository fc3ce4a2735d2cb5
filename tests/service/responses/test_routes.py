"""POST /v1/responses against a scripted engine, through the openai SDK's own client and stream helper: the
output items, the event grammar Codex and the SDK need, errors before and after the headers, keep-alives."""

from __future__ import annotations

import json
from typing import Any

import anyio
import jinja2
import openai
import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.config import ServiceConfig
from service.responses.history import seal_reasoning
from service.state import AppState
from tests.service.asgi import ASGIClient, asgi_scope
from tests.service.conftest import sse_events
from tests.service.chat.test_render import PLAIN, TemplateTokenizer
from tests.service.chat.test_routes import CALL, CallingTokenizer
from tests.service.sse_events import named_events as response_events
from tests.service.fake_engine import FakeEngine, FakeTokenizer

TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": False}]
THINK_TEXT_CALL = ["<think>", "hmm", "</think>", "Sunny ", "today.", CALL]


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine(list(THINK_TEXT_CALL))
    engine.tokenizer = CallingTokenizer()
    return engine


def test_a_reply_of_thinking_text_and_a_call_is_three_items(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="fake-model", input="weather?", tools=TOOLS)
    assert response.status == "completed" and response.object == "response"
    reasoning, message, call = response.output
    # The thinking as the summary by default (what the AI SDK, pydantic-ai and LangChain's streams read).
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "hmm" and reasoning.content is None
    assert message.type == "message" and response.output_text == "Sunny today."
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.status == "completed"
    usage = response.usage
    assert usage.output_tokens == len(THINK_TEXT_CALL)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # The thinking's own tokens ("hmm": three with one token a character), not what followed before it closed.
    assert usage.output_tokens_details.reasoning_tokens == len("hmm")
    assert usage.input_tokens_details.cached_tokens == 0


def test_the_sdk_stream_helper_assembles_the_non_streamed_response(sdk: openai.OpenAI) -> None:
    whole = sdk.responses.create(model="fake-model", input="weather?", tools=TOOLS)
    with sdk.responses.stream(model="fake-model", input="weather?", tools=TOOLS) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert final.output_text == whole.output_text
    assert [i.type for i in final.output] == [i.type for i in whole.output]
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    assert "response.reasoning_summary_text.delta" in kinds
    with sdk.responses.stream(model="fake-model", input="weather?", tools=TOOLS, reasoning={"summary": "none"}) as raw:
        raw_kinds = [event.type for event in raw]
        thinking = raw.get_final_response().output[0]
    assert "response.reasoning_text.delta" in raw_kinds and thinking.content[0].text == "hmm" and not thinking.summary


def test_every_item_event_falls_between_its_added_and_done(http: TestClient[Any]) -> None:
    # What Codex needs ("OutputTextDelta without active item" drops the text) and the SDK checks.
    events = response_events(http.post("/v1/responses", json={"input": "hi", "tools": TOOLS, "stream": True}).text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    ids = {e["response"]["id"] for e in events if "response" in e}
    assert len(ids) == 1
    open_index: int | None = None
    for event in events[2:-1]:
        if event["type"] == "response.output_item.added":
            assert open_index is None
            open_index = event["output_index"]
        elif event["type"] == "response.output_item.done":
            assert event["output_index"] == open_index
            open_index = None
        else:
            assert event["output_index"] == open_index, event
    assert open_index is None
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert events[-1]["response"]["output"] == done  # complete: the agents SDK reads only this event's output
    assert events[-1]["response"]["usage"]["output_tokens"] == len(THINK_TEXT_CALL)


def test_a_summary_request_gets_the_thinking_as_summary_and_sealed_for_the_next_turn(sdk: openai.OpenAI,
                                                                                    engine: FakeEngine) -> None:
    with sdk.responses.stream(model="fake-model", input="weather?", tools=TOOLS, reasoning={"summary": "auto"},
                              include=["reasoning.encrypted_content"]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    reasoning = final.output[0]
    assert reasoning.summary[0].text == "hmm" and "response.reasoning_summary_text.delta" in kinds
    assert reasoning.encrypted_content
    # Codex sends the items back with the summary left out: the sealed thinking still reaches the template.
    echoed = {**reasoning.model_dump(exclude_none=True), "summary": []}
    call = final.output[2]
    sdk.responses.create(model="fake-model", tools=TOOLS, input=[
        {"role": "user", "content": "weather?"}, echoed, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}])
    messages = engine.tokenizer.template_calls[-1]["messages"]
    assert messages[1]["reasoning_content"] == "hmm"
    assert messages[1]["tool_calls"][0]["id"] == call.call_id and messages[2]["tool_call_id"] == call.call_id


def test_a_custom_tool_is_a_function_of_one_string_and_its_call_a_custom_tool_call(http: TestClient[Any],
                                                                                  engine: FakeEngine) -> None:
    patch = "*** Begin Patch\n*** End Patch"
    arguments = json.dumps({"input": patch})
    engine.pieces = ['<tool_call>{"name": "apply_patch", "arguments": ' + arguments + '}</tool_call>']
    body = {"input": "fix it", "tools": [{"type": "custom", "name": "apply_patch", "description": "Edit files."}]}
    reply = http.post("/v1/responses", json=body).json()
    (item,) = reply["output"]
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch" and item["input"] == patch
    (tool,) = engine.tokenizer.template_calls[-1]["tools"]
    assert tool["function"]["parameters"]["required"] == ["input"]
    events = response_events(http.post("/v1/responses", json={**body, "stream": True}).text)
    assert [e["input"] for e in events if e["type"] == "response.custom_tool_call_input.done"] == [patch]


def test_a_namespaced_function_is_offered_under_its_full_name_and_called_back_by_its_own(
        http: TestClient[Any], engine: FakeEngine) -> None:
    engine.pieces = ['<tool_call>{"name": "mcp__git__status", "arguments": {}}</tool_call>']
    tools = [{"type": "namespace", "name": "mcp__git__", "tools": [{"type": "function", "name": "status"}]}]
    (item,) = http.post("/v1/responses", json={"input": "status?", "tools": tools}).json()["output"]
    assert (item["name"], item["namespace"]) == ("status", "mcp__git__")
    assert engine.tokenizer.template_calls[-1]["tools"][0]["function"]["name"] == "mcp__git__status"


def test_the_openai_tools_codex_declares_are_accepted_and_not_offered(http: TestClient[Any],
                                                                      engine: FakeEngine) -> None:
    codex = [{"type": "web_search", "external_web_access": False}, {"type": "local_shell"}]
    response = http.post("/v1/responses", json={"input": "hi", "tools": [*TOOLS, *codex]})
    assert response.status_code == 200
    assert [t["function"]["name"] for t in engine.tokenizer.template_calls[-1]["tools"]] == ["get_weather"]
    # Not echoed as if the model had them: the Response's tools are those offered.
    assert [t["type"] for t in response.json()["tools"]] == ["function"]


@pytest.mark.parametrize("tool", [
    {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.deepwiki.com/mcp"},
    {"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "browser"},
    {"type": "image_generation"}])
def test_openai_tools_that_could_never_be_used_here_are_refused_by_name(http: TestClient[Any], engine: FakeEngine,
                                                                         tool: dict[str, Any]) -> None:
    # They were echoed back in `tools` as if active, and dropped.
    error = http.post("/v1/responses", json={"input": "hi", "tools": [*TOOLS, tool]}).json()["error"]
    assert error["param"] == "tools.1" and f"{tool['type']!r}" in error["message"], error
    assert "and none runs here" in error["message"] and not engine.requests


@pytest.mark.parametrize("choice", [{"type": "web_search_preview"}, {"type": "file_search"},
                                    {"type": "mcp", "server_label": "deepwiki"}, {"type": "local_shell"}])
def test_forcing_an_openai_tool_is_refused_in_words(http: TestClient[Any], choice: dict[str, Any]) -> None:
    # It said "tool_choice.name: Field required (also invalid: tool_choice.type)".
    body = {"input": "hi", "tools": [{"type": "web_search_preview"}], "tool_choice": choice}
    error = http.post("/v1/responses", json=body).json()["error"]
    assert error["param"] == "tool_choice", error
    assert error["message"].startswith(f"tool_choice: {choice['type']!r} cannot be forced"), error


def test_required_beside_only_openai_tools_says_they_are_not_offered(http: TestClient[Any]) -> None:
    # It said "needs at least one tool" of a request that declared one.
    body = {"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": "required"}
    error = http.post("/v1/responses", json=body).json()["error"]
    assert error["param"] == "tool_choice" and "(web_search) are OpenAI's own" in error["message"], error


def test_chats_sampling_fields_open_webui_sends_at_the_top_level_reach_the_engine(http: TestClient[Any],
                                                                                  engine: FakeEngine) -> None:
    response = http.post("/v1/responses", json={"input": "hi", "seed": 7, "top_k": 5, "min_p": 0.1,
                                                 "repetition_penalty": 1.1, "presence_penalty": 0.5,
                                                 "frequency_penalty": 0.25})
    assert response.status_code == 200, response.text
    s = engine.requests[-1].sampling
    assert (s.seed, s.top_k, s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (
        7, 5, 0.1, 1.1, 0.5, 0.25)


def test_reasoning_effort_at_the_top_level_is_reasoning_effort_and_not_both(http: TestClient[Any],
                                                                           engine: FakeEngine) -> None:
    assert http.post("/v1/responses", json={"input": "hi", "reasoning_effort": "none"}).status_code == 200
    alone = engine.tokenizer.template_calls[-1]
    assert http.post("/v1/responses", json={"input": "hi", "reasoning": {"effort": "none"}}).status_code == 200
    assert alone == engine.tokenizer.template_calls[-1] and alone["enable_thinking"] is False
    # The Response echoes the effort applied, in the nested form (it said null for a top-level one).
    for body in ({"reasoning_effort": "low"}, {"reasoning_effort": "low", "reasoning": {"summary": "none"}}):
        echoed = http.post("/v1/responses", json={"input": "hi", **body}).json()["reasoning"]
        assert echoed == {"effort": "low", "summary": body.get("reasoning", {}).get("summary")}, echoed
    assert http.post("/v1/responses", json={"input": "hi"}).json()["reasoning"] is None
    both = http.post("/v1/responses", json={"input": "hi", "reasoning_effort": "low", "reasoning": {"effort": "low"}})
    assert both.status_code == 400 and both.json()["error"]["param"] == "reasoning_effort"
    bad = http.post("/v1/responses", json={"input": "hi", "top_k": -2})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_k"


def test_vllms_ignore_eos_and_min_tokens_reach_the_engine(http: TestClient[Any], engine: FakeEngine) -> None:
    # `vllm bench serve --backend openai-responses` sends ignore_eos: true with its random dataset.
    response = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 8, "ignore_eos": True,
                                                 "min_tokens": 3, "stream": True, "store": False})
    assert response.status_code == 200 and response_events(response.text)[-1]["type"] == "response.completed"
    assert (engine.requests[-1].ignore_eos, engine.requests[-1].min_tokens) == (True, 3)
    assert http.post("/v1/responses", json={"input": "hi", "ignore_eos": False}).status_code == 200
    assert (engine.requests[-1].ignore_eos, engine.requests[-1].min_tokens) == (False, 0)
    past = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2, "min_tokens": 3}).json()["error"]
    assert past["param"] == "min_tokens" and "max_output_tokens (2)" in past["message"], past


def test_parallel_tool_calls_false_ends_the_reply_at_its_first_call(http: TestClient[Any], engine: FakeEngine) -> None:
    engine.pieces = [CALL, CALL]
    both = http.post("/v1/responses", json={"input": "hi", "tools": TOOLS}).json()["output"]
    one = http.post("/v1/responses", json={"input": "hi", "tools": TOOLS, "parallel_tool_calls": False}).json()
    assert len(both) == 2 and len(one["output"]) == 1 and one["parallel_tool_calls"] is False


def test_max_output_tokens_makes_an_incomplete_response(http: TestClient[Any], engine: FakeEngine) -> None:
    engine.pieces = ["a", "b", "c", "d"]
    reply = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2}).json()
    assert reply["status"] == "incomplete" and reply["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply["output"][0]["content"][0]["text"] == "ab" and reply["output"][0]["status"] == "incomplete"
    assert engine.requests[-1].max_tokens == 2
    events = response_events(http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2,
                                                               "stream": True}).text)
    assert events[-1]["type"] == "response.incomplete"


def test_a_reply_that_says_nothing_is_one_empty_message(http: TestClient[Any], engine: FakeEngine) -> None:
    engine.pieces = [""]
    reply = http.post("/v1/responses", json={"input": "hi"}).json()
    assert [(i["type"], i["content"][0]["text"]) for i in reply["output"]] == [("message", "")]


def test_a_failure_after_the_headers_is_response_failed_keeping_what_was_said(http: TestClient[Any],
                                                                             engine: FakeEngine) -> None:
    engine.pieces, engine.fail_with = ["a", "b", "c"], "the step failed"
    events = response_events(http.post("/v1/responses", json={"input": "hi", "stream": True}).text)
    failed = events[-2]["response"]
    assert events[-2]["type"] == "response.failed" and not any(e["type"] == "response.completed" for e in events)
    # The engine's own code (chat's in-band error has it too), not one kind for every failure.
    assert failed["error"] == {"code": "internal_error", "message": "the step failed"}
    # What streamed before the failure stays in the response, its item closed, with usage.
    assert events[-3]["type"] == "response.output_item.done" and events[-3]["item"]["status"] == "incomplete"
    assert failed["output"] == [events[-3]["item"]] and failed["output"][0]["content"][0]["text"] == "a"
    assert failed["usage"]["output_tokens"] >= 1
    # Then OpenAI's `error` event, on which the openai SDKs raise (they do not on response.failed).
    assert events[-1]["type"] == "error" and events[-1]["error"]["message"] == "the step failed"
    assert events[-1]["code"] == "internal_error"


def test_a_failure_after_the_headers_raises_in_the_openai_sdk(sdk: openai.OpenAI, engine: FakeEngine) -> None:
    # pydantic-ai, llama-index and LangChain JS returned the cut text as a whole reply.
    engine.pieces, engine.fail_with = ["a", "b", "c"], "the step failed"
    with pytest.raises(openai.APIError, match="the step failed"):
        with sdk.responses.stream(model="fake-model", input="hi") as stream:
            for _ in stream:
                pass


def test_the_limit_the_server_applied_is_said(http: TestClient[Any], engine: FakeEngine) -> None:
    # Codex sends no max_output_tokens: an `incomplete` for max_output_tokens must name the cap that cut it.
    engine.pieces = ["a"]
    reply = http.post("/v1/responses", json={"input": "hi"}).json()
    assert reply["max_output_tokens"] == engine.requests[-1].max_tokens
    assert http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 5}).json()["max_output_tokens"] == 5


def test_a_failure_before_the_first_token_is_a_500(http: TestClient[Any], engine: FakeEngine) -> None:
    engine.fail_with, engine.fail_at = "the step failed", 0
    for stream in (False, True):
        response = http.post("/v1/responses", json={"input": "hi", "stream": stream})
        assert response.status_code == 500 and response.json()["error"]["message"] == "the step failed"


def test_errors_about_the_translated_request_name_the_responses_field(http: TestClient[Any],
                                                                       engine: FakeEngine) -> None:
    engine.context_length = 40
    response = http.post("/v1/responses", json={"input": "x" * 100})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"
    engine.tokenizer = TemplateTokenizer(PLAIN)  # a template with no thinking switch, a model that does not think
    engine.context_length = 256
    response = http.post("/v1/responses", json={"input": "hi", "reasoning": {"effort": "high"}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "reasoning.effort" and error["message"].startswith("reasoning.effort: ")
    top = http.post("/v1/responses", json={"input": "hi", "reasoning_effort": "high"}).json()["error"]
    assert top["param"] == "reasoning_effort" and top["message"].startswith("reasoning_effort: "), top  # as sent


def test_settings_reach_the_engine(http: TestClient[Any], engine: FakeEngine) -> None:
    body = {"input": "hi", "temperature": 0.3, "top_p": 0.9, "max_output_tokens": 7, "prompt_cache_key": "thread-1",
            "metadata": {"k": "v"}, "instructions": "Be brief."}
    reply = http.post("/v1/responses", json=body).json()
    request = engine.requests[-1]
    assert (request.sampling.temperature, request.sampling.top_p, request.max_tokens) == (0.3, 0.9, 7)
    assert request.session_id == "thread-1"
    assert reply["metadata"] == {"k": "v"} and reply["instructions"] == "Be brief." and reply["temperature"] == 0.3
    assert engine.tokenizer.template_calls[-1]["messages"][0] == {"role": "system", "content": "Be brief."}


@pytest.mark.anyio
async def test_a_slow_first_token_gets_lifecycle_events_meanwhile(monkeypatch) -> None:
    # Codex's idle timer counts events, not SSE comments: created, then in_progress while the prompt waits.
    from service.chat import respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    engine = FakeEngine(pieces=["a", "b"])
    engine.first_gate = anyio.Event()
    app = create_app(AppState(engine=engine, ready=True, config=ServiceConfig(sse_keepalive=0.01)))
    client = ASGIClient({"input": "hi", "stream": True}, marker=b"event: response.in_progress")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(app, asgi_scope("/v1/responses"), client.receive, client.send)
            await client.first.wait()
            while b"".join(client.chunks).count(b"event: response.in_progress") < 2:
                await anyio.sleep(0.01)  # polling a list the app task fills; the gate keeps the token back
            engine.first_gate.set()
            await client.leave.wait()
    events = response_events(b"".join(client.chunks).decode())
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds.count("response.created") == 1
    assert kinds[-1] == "response.completed" and events[-1]["response"]["output"][0]["content"][0]["text"] == "ab"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


@pytest.mark.anyio
async def test_a_client_that_leaves_mid_stream_frees_the_row() -> None:
    engine = FakeEngine(pieces=["a", "b", "c"])
    engine.gate = anyio.Event()
    app = create_app(AppState(engine=engine, ready=True))
    client = ASGIClient({"input": "hi", "stream": True}, marker=b"response.output_text.delta")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(app, asgi_scope("/v1/responses"), client.receive, client.send)
            await client.first.wait()
            client.leave.set()
    assert engine.active == set() and engine.closed_streams >= 1


class RefusingTokenizer(FakeTokenizer):
    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any) -> Any:
        raise jinja2.TemplateError("roles must alternate")


def test_a_template_error_keeps_its_sentence_and_names_input(http: TestClient[Any], engine: FakeEngine) -> None:
    # "The chat template rejected these input": the rename went into the sentence.
    engine.tokenizer = RefusingTokenizer()
    error = http.post("/v1/responses", json={"input": "hi"}).json()["error"]
    assert error["param"] == "input" and "these messages: roles must alternate" in error["message"], error


def test_items_this_server_issued_can_be_referred_to_by_id(http: TestClient[Any], engine: FakeEngine) -> None:
    # The Vercel AI SDK sends earlier output as item_reference unless told store: false: its second turn was a 400.
    first = http.post("/v1/responses", json={"input": "weather?", "tools": TOOLS}).json()
    reasoning, message, call = first["output"]
    refs = [{"type": "item_reference", "id": item["id"]} for item in first["output"]]
    second = http.post("/v1/responses", json={"tools": TOOLS, "input": [
        {"role": "user", "content": "weather?"}, *refs,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "18C"}]})
    assert second.status_code == 200, second.text
    assistant = engine.tokenizer.template_calls[-1]["messages"][1]
    assert assistant["content"] == "Sunny today." and assistant["reasoning_content"] == "hmm"
    assert assistant["tool_calls"][0]["id"] == call["call_id"]


def test_a_reference_to_an_item_not_kept_says_what_to_send(http: TestClient[Any]) -> None:
    response = http.post("/v1/responses", json={"input": [{"type": "item_reference", "id": "msg_elsewhere"}]})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "input.0" and error["code"] == "item_not_found"
    assert "store: false" in error["message"]


def test_items_are_referred_to_only_with_the_key_that_was_given_them(engine: FakeEngine) -> None:
    state = AppState(engine=engine, config=ServiceConfig(api_keys=["k1", "k2"]))
    with TestClient(create_app(state)) as client:
        first = client.post("/v1/responses", json={"input": "hi"}, headers={"Authorization": "Bearer k1"}).json()
        ref = {"input": [{"type": "item_reference", "id": first["output"][-1]["id"]}]}
        assert client.post("/v1/responses", json=ref, headers={"Authorization": "Bearer k2"}).status_code == 400
        assert client.post("/v1/responses", json=ref, headers={"Authorization": "Bearer k1"}).status_code == 200


def test_a_response_continues_from_a_kept_one(sdk: openai.OpenAI, engine: FakeEngine) -> None:
    # The openai docs' way to hold a conversation; it was a 400.
    engine.pieces = ["Paris."]
    first = sdk.responses.create(model="fake-model", instructions="Be brief.", input="Capital of France?")
    engine.pieces = ["Lyon."]
    second = sdk.responses.create(model="fake-model", input="And its second city?", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.store is True
    messages = engine.tokenizer.template_calls[-1]["messages"]
    # The instructions are not carried over (as OpenAI's); the conversation is.
    assert messages == [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."},
                        {"role": "user", "content": "And its second city?"}]
    sdk.responses.create(model="fake-model", input="A third?", previous_response_id=second.id)
    assert [m["content"] for m in engine.tokenizer.template_calls[-1]["messages"]] == [
        "Capital of France?", "Paris.", "And its second city?", "Lyon.", "A third?"]


def test_a_response_with_store_false_is_not_kept(http: TestClient[Any]) -> None:
    first = http.post("/v1/responses", json={"input": "hi", "store": False}).json()
    assert first["store"] is False
    response = http.post("/v1/responses", json={"input": "more", "previous_response_id": first["id"]})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "previous_response_id"
    assert error["code"] == "previous_response_not_found"


def test_a_kept_response_is_retrieved_and_deleted(sdk: openai.OpenAI, http: TestClient[Any]) -> None:
    created = sdk.responses.create(model="fake-model", input="hi")
    retrieved = sdk.responses.retrieve(created.id)
    assert retrieved.id == created.id and retrieved.output_text == created.output_text
    assert retrieved.usage is not None and retrieved.status == "completed"
    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)
    unkept = http.post("/v1/responses", json={"input": "hi", "store": False}).json()
    assert http.get(f"/v1/responses/{unkept['id']}").status_code == 404


def test_usage_says_the_prompt_tokens_read_from_and_written_to_the_prefix_cache(http: TestClient[Any],
                                                                               engine: FakeEngine) -> None:
    """openai-python's and openai-java's ResponseUsage require input_tokens_details.cache_write_tokens: on the create
    answer, GET /v1/responses/{id} and response.completed alike; chat's prompt_tokens_details says the same."""
    from openai.types.responses import ResponseUsage

    engine.cached_tokens, engine.cache_write_tokens = 4, 6
    created = http.post("/v1/responses", json={"input": "hi"}).json()
    retrieved = http.get(f"/v1/responses/{created['id']}").json()
    completed = response_events(http.post("/v1/responses", json={"input": "hi", "stream": True}).text)[-1]
    assert completed["type"] == "response.completed"
    for usage in (created["usage"], retrieved["usage"], completed["response"]["usage"]):
        details = ResponseUsage.model_validate(usage).input_tokens_details
        assert (details.cached_tokens, details.cache_write_tokens) == (4, 6), usage
    chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 4, "cache_write_tokens": 6}
    streamed = [e for e in sse_events(http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}).text) if e != "[DONE]"]
    assert streamed[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 4, "cache_write_tokens": 6}


def test_continuing_a_response_whose_earlier_turn_was_deleted_names_that_turn(http: TestClient[Any]) -> None:
    # It said the response sent was not kept, while GET of that response still found it.
    first = http.post("/v1/responses", json={"input": "hi"}).json()
    second = http.post("/v1/responses", json={"input": "more", "previous_response_id": first["id"]}).json()
    assert http.delete(f"/v1/responses/{first['id']}").status_code == 200
    assert http.get(f"/v1/responses/{second['id']}").status_code == 200
    error = http.post("/v1/responses", json={"input": "x", "previous_response_id": second["id"]}).json()["error"]
    assert error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"
    assert f"{second['id']!r} continues {first['id']!r}, which is no longer kept" in error["message"], error


def test_deleting_a_response_forgets_the_output_items_it_gave(http: TestClient[Any]) -> None:
    # They stayed resolvable by item_reference: a deleted reply's text was still served.
    created = http.post("/v1/responses", json={"input": "hi"}).json()
    refs = [{"type": "item_reference", "id": item["id"]} for item in created["output"]]
    assert http.post("/v1/responses", json={"input": refs, "store": False}).status_code == 200
    assert http.delete(f"/v1/responses/{created['id']}").status_code == 200
    response = http.post("/v1/responses", json={"input": refs})
    assert response.status_code == 400 and response.json()["error"]["code"] == "item_not_found"


def test_references_that_hold_more_than_the_context_are_refused_before_joining(http: TestClient[Any],
                                                                               engine: FakeEngine) -> None:
    # A 7 MB body of references to one long reply became a 650 MB conversation, built on the event loop.
    engine.pieces = ["x" * 100]
    message = http.post("/v1/responses", json={"input": "hi"}).json()["output"][0]
    refs = [{"type": "item_reference", "id": message["id"]}] * 1000
    response = http.post("/v1/responses", json={"input": refs})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded"
    assert error["param"] == "input.2"  # the third reference: 300 characters, over the 256 the context holds


def test_store_false_keeps_no_items_either(http: TestClient[Any]) -> None:
    # As OpenAI: "Items are not persisted when `store` is set to false."
    message = http.post("/v1/responses", json={"input": "hi", "store": False}).json()["output"][0]
    response = http.post("/v1/responses", json={"input": [{"type": "item_reference", "id": message["id"]}]})
    assert response.status_code == 400 and response.json()["error"]["code"] == "item_not_found"


def test_a_context_error_names_the_input(http: TestClient[Any], engine: FakeEngine) -> None:
    engine.context_length = 40
    error = http.post("/v1/responses", json={"input": "x" * 100}).json()["error"]
    assert error["param"] == "input" and "characters in the input," in error["message"]
    assert "messages" not in error["message"]


def test_max_tool_calls_ends_the_reply_with_the_call_that_reaches_it(http: TestClient[Any], engine: FakeEngine) -> None:
    # The Vercel AI SDK's maxToolCalls; it was a 400.
    engine.pieces = [CALL, CALL, CALL, "after"]
    reply = http.post("/v1/responses", json={"input": "hi", "tools": TOOLS, "max_tool_calls": 2}).json()
    assert [item["type"] for item in reply["output"]] == ["function_call", "function_call"]
    assert reply["status"] == "completed" and reply["max_tool_calls"] == 2  # the third call and the text never came
    events = response_events(http.post("/v1/responses", json={"input": "hi", "tools": TOOLS, "max_tool_calls": 2,
                                                               "stream": True}).text)
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == ["function_call"] * 2
    assert events[-1]["type"] == "response.completed"
    # parallel_tool_calls false is still one call; a limit above the calls made changes nothing.
    one = http.post("/v1/responses", json={"input": "hi", "tools": TOOLS, "max_tool_calls": 2,
                                           "parallel_tool_calls": False}).json()
    assert len(one["output"]) == 1
    more = http.post("/v1/responses", json={"input": "hi", "tools": TOOLS, "max_tool_calls": 5}).json()
    assert [item["type"] for item in more["output"]] == ["function_call"] * 3 + ["message"]


def test_max_tool_calls_0_offers_no_tool(http: TestClient[Any], engine: FakeEngine) -> None:
    engine.pieces = ["No calls."]
    for choice in ({}, {"tool_choice": "auto"}):
        reply = http.post("/v1/responses", json={"input": "hi", "tools": TOOLS, "max_tool_calls": 0, **choice})
        assert reply.status_code == 200, reply.text
        assert engine.tokenizer.template_calls[-1]["tools"] is None  # as tool_choice "none"
        assert reply.json()["output"][0]["content"][0]["text"] == "No calls."
    forced = http.post("/v1/responses", json={"input": "hi", "tools": TOOLS, "max_tool_calls": 0,
                                              "tool_choice": {"type": "function", "name": "get_weather"}})
    assert forced.status_code == 400 and forced.json()["error"]["param"] == "max_tool_calls"


def test_retrieving_refuses_what_it_cannot_honour_by_name(http: TestClient[Any]) -> None:
    # openai-node's retrieve(id, {stream: true}) iterated zero events with no error: every parameter was ignored.
    created = http.post("/v1/responses", json={"input": "weather?", "tools": TOOLS}).json()
    path = f"/v1/responses/{created['id']}"
    for query, param in (("stream=true", "stream"), ("starting_after=3", "starting_after"),
                         ("include_obfuscation=true", "include_obfuscation"), ("foo=1", "foo"),
                         ("include=message.output_text.logprobs", "include")):
        response = http.get(f"{path}?{query}")
        assert response.status_code == 400 and response.json()["error"]["param"] == param, (query, response.text)
    assert "background" in http.get(f"{path}?stream=true").json()["error"]["message"]
    for query in ("stream=false", "include_obfuscation=false", ""):
        assert http.get(f"{path}?{query}").json() == created
    assert http.delete(f"{path}?foo=1").json()["error"]["param"] == "foo"
    assert http.get(path).status_code == 200  # the refused DELETE forgot nothing


def test_retrieving_with_include_seals_the_thinking(http: TestClient[Any]) -> None:
    created = http.post("/v1/responses", json={"input": "weather?", "tools": TOOLS}).json()
    assert created["output"][0]["encrypted_content"] is None
    for query in ("include=reasoning.encrypted_content", "include[]=reasoning.encrypted_content"):
        reasoning = http.get(f"/v1/responses/{created['id']}?{query}").json()["output"][0]
        assert reasoning["encrypted_content"] == seal_reasoning("hmm"), reasoning


def test_input_tokens_counts_the_prompt_the_response_would_have(sdk: openai.OpenAI, http: TestClient[Any],
                                                                 engine: FakeEngine) -> None:
    # openai-node's responses.inputTokens.count was a 405: input_tokens matched GET /v1/responses/{id}.
    engine.pieces = ["Sunny."]
    fields: dict[str, Any] = {"model": "fake-model", "instructions": "Be brief.", "input": "weather?", "tools": TOOLS,
                              "reasoning": {"effort": "none"}}
    counted = sdk.responses.input_tokens.count(**fields)
    created = sdk.responses.create(**fields)
    assert counted.object == "response.input_tokens" and created.usage is not None
    assert counted.input_tokens == created.usage.input_tokens
    assert sdk.responses.input_tokens.count(model="fake-model", input="weather?").input_tokens < counted.input_tokens
    # A continued conversation counts what it continues, as the next response's prompt does.
    more = {"previous_response_id": created.id, "input": "and tomorrow?"}
    assert http.post("/v1/responses/input_tokens", json=more).json()["input_tokens"] == \
        http.post("/v1/responses", json=more).json()["usage"]["input_tokens"]
    for body, param in (({"instructions": "x"}, "input"), ({"input": "hi", "stream": True}, "stream"),
                        ({"input": "hi", "tools": [{"type": "file_search"}]}, "tools.0"),
                        ({"input": "hi", "previous_response_id": "resp_gone"}, "previous_response_id")):
        response = http.post("/v1/responses/input_tokens", json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_the_response_echoes_the_cache_retention_and_verbosity_accepted(http: TestClient[Any]) -> None:
    # It said prompt_cache_retention null of a request that sent one, and left text.verbosity out.
    for sent, echoed in (("24h", "24h"), ("in_memory", "in_memory"), ("in-memory", "in_memory"), (None, None)):
        body = {"input": "hi", "prompt_cache_retention": sent, "text": {"verbosity": "medium"}}
        response = http.post("/v1/responses", json=body)
        assert response.status_code == 200, response.text
        reply = response.json()
        assert reply["prompt_cache_retention"] == echoed and reply["text"]["verbosity"] == "medium", reply
        assert http.get(f"/v1/responses/{reply['id']}").json()["prompt_cache_retention"] == echoed


def test_a_forced_function_not_marked_strict_is_called_whatever_its_parameters(tiny_loaded: Any) -> None:
    # A lookahead pattern cannot be enforced: a forced call of the function was a 400 (tools.0.function.parameters),
    # where OpenAI takes a schema not marked strict without enforcing it.
    from engine.runtime import Engine

    schema = {"type": "object", "properties": {"password": {"type": "string", "pattern": "(?=.*\\d)"}}}
    with TestClient(create_app(AppState(engine=Engine(tiny_loaded, max_iteration_tokens=8)))) as http:
        reply = http.post("/v1/responses", json={
            "input": "Call f.", "max_output_tokens": 200, "temperature": 0,  # "hi": the random model wrote one long key
            "tool_choice": {"type": "function", "name": "f"},
            "tools": [{"type": "function", "name": "f", "parameters": schema, "strict": False}]})
    assert reply.status_code == 200, reply.text
    call = next(item for item in reply.json()["output"] if item["type"] == "function_call")
    assert call["name"] == "f" and isinstance(json.loads(call["arguments"]), dict), call
