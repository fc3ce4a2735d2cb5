"""huggingface_hub's InferenceClient (TGI's own client) against the app: chat by the name it sends ("dummy"), JSON
output in the TGI shape it rewrites json_schema to, a forced call named without `type`, and its generate and speech
calls, which POST to the base URL itself, told where the API is."""

from __future__ import annotations

from typing import Any, Iterator

import httpx2
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.inference._generated.types.chat_completion import (
    ChatCompletionInputFunctionName,
    ChatCompletionInputToolChoiceClass,
)
from huggingface_hub.utils import _http
from litestar.testing import TestClient

from engine.constraints import json_grammar
from service.app import create_app
from service.state import AppState
from tests.service.fake_engine import FakeEngine, FakeTokenizer

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
USER = [{"role": "user", "content": "weather in Paris?"}]


class _PlainTemplate(FakeTokenizer):
    """A template that takes no tools: they are told in the prompt and calls are <tool_call> JSON (as the demo's)."""

    chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"


class _Forward(httpx2.BaseTransport):
    """huggingface_hub's HTTP client (httpx2) onto Litestar's in-process TestClient."""

    def __init__(self, client: TestClient[Any]) -> None:
        self.client = client

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        answer = self.client.request(request.method, request.url.path, content=request.read(),
                                     headers=dict(request.headers))
        return httpx2.Response(answer.status_code, headers=answer.headers.multi_items(), content=answer.content)


@pytest.fixture
def served() -> Iterator[tuple[InferenceClient, FakeEngine]]:
    engine = FakeEngine([CALL], context_length=4096)
    engine.tokenizer = _PlainTemplate()
    with TestClient(create_app(AppState(engine=engine))) as client:
        _http.set_client_factory(lambda: httpx2.Client(transport=_Forward(client)))
        try:
            yield InferenceClient(base_url="http://testserver/v1"), engine
        finally:
            _http.set_client_factory(_http.default_client_factory)


def test_chat_json_output_and_a_forced_call_through_the_inference_client(
        served: tuple[InferenceClient, FakeEngine]) -> None:
    # Every call sent "model": "dummy" (a 404), json_schema arrived as TGI's {"type": "json_object", "value": ...}
    # and the typed tool_choice without "type" (both 400s).
    hf, engine = served
    reply = hf.chat_completion(USER, max_tokens=20)
    assert reply.choices[0].message.content == CALL
    hf.chat_completion(USER, max_tokens=20, response_format={"type": "json_schema", "json_schema": {
        "name": "answer", "schema": SCHEMA}})
    assert engine.requests[-1].sampling.grammar.text == json_grammar(SCHEMA, lenient=True)
    choice = ChatCompletionInputToolChoiceClass(function=ChatCompletionInputFunctionName(name="get_weather"))
    called = hf.chat_completion(USER, max_tokens=40, tools=TOOLS, tool_choice=choice)
    calls = called.choices[0].message.tool_calls
    assert calls is not None and calls[0].function.name == "get_weather"
    forced = engine.requests[-1].sampling.grammar
    assert forced.text is None and "get_weather" in forced.calls


def test_tgis_generate_calls_are_told_what_is_served(served: tuple[InferenceClient, FakeEngine]) -> None:
    # text_generation and automatic_speech_recognition POST to the base URL (TGI's `/` route): "Invalid URL" alone
    # read as a wrong base_url.
    hf, _ = served
    for call in (lambda: hf.text_generation("Once upon", max_new_tokens=5),
                 lambda: hf.automatic_speech_recognition(b"RIFF\x00\x00\x00\x00WAVE")):
        with pytest.raises(HfHubHTTPError) as caught:
            call()
        message = caught.value.response.json()["error"]["message"]
        assert caught.value.response.status_code == 404 and "Invalid URL (POST /v1)" in message
        assert "TGI's generate API is not served here: /v1/completions (text)" in message
