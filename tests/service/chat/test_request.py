"""service/chat/request.py: the engine request a chat body becomes, its defaults from the model's recommendation."""

from __future__ import annotations

from typing import Any

import pytest

from service.chat.request import generation_request
from service.chat.schemas import ChatCompletionRequest
from tests.service.fake_engine import FakeEngine


def _max_tokens(engine: FakeEngine, max_tokens: int | None, cap: int | None = 100) -> int:
    body = ChatCompletionRequest.model_validate({"model": "fake-model",
                                                 "messages": [{"role": "user", "content": "hi"}]})
    request = generation_request(engine, body, [1, 2, 3], max_tokens, param="messages", default_max_tokens=cap)
    assert request.sampling.temperature == engine.sampling_defaults.get("temperature", 1.0)  # the rest still apply
    return request.max_tokens


def test_a_request_without_max_tokens_takes_max_new_tokens_within_the_cap() -> None:
    # generation_config.json's max_new_tokens (engine/models.py sampling_defaults' max_tokens) was ignored: replies
    # ran to the server's --max-tokens-cap. As in vLLM it is the default; a request's own max_tokens wins.
    engine = FakeEngine(context_length=256)
    engine.sampling_defaults = {"max_tokens": 5, "temperature": 0.6}
    assert _max_tokens(engine, None) == 5
    assert _max_tokens(engine, 50) == 50
    assert _max_tokens(engine, None, cap=3) == 3  # the server's cap still bounds it
    assert _max_tokens(engine, None, cap=None) == 5
    engine.sampling_defaults = {"max_tokens": 1000}
    assert _max_tokens(engine, None, cap=None) == 256 - 3  # and the context
    engine.sampling_defaults = {}
    assert _max_tokens(engine, None) == 100


def test_skip_special_tokens_reaches_the_engine_request() -> None:
    # vLLM's field was refused as unknown; special tokens written mid-reply are left out unless it is false.
    engine = FakeEngine(context_length=256)
    for sent, wanted in ((None, True), (True, True), (False, False)):
        extra = {} if sent is None else {"skip_special_tokens": sent}
        body = ChatCompletionRequest.model_validate({"model": "fake-model", **extra,
                                                     "messages": [{"role": "user", "content": "hi"}]})
        request = generation_request(engine, body, [1, 2, 3], None, param="messages", default_max_tokens=10)
        assert request.skip_special_tokens is wanted


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/responses", {"input": "hi"}),
    ("/tokenize", {"prompt": "hi"}),
])
def test_tgis_names_stand_for_the_served_chat_model_on_every_route(client: Any, path: str,
                                                                   body: dict[str, Any]) -> None:
    # huggingface_hub's InferenceClient(base_url=...) sends "dummy", TGI's docs tell OpenAI SDK users "tgi": both
    # were a 404 model_not_found on every call. Another unknown name still is.
    for name in ("tgi", "dummy"):
        response = client.post(path, json={"model": name, **body})
        assert response.status_code == 200, (name, response.text)
    refused = client.post(path, json={"model": "gpt-9", **body})
    assert refused.status_code == 404 and "gpt-9" in refused.text


def test_demo_names_the_chat_demo_on_chat_routes_while_whisper_answers_to_it_too() -> None:
    # `tandem serve` with no model serves both demos, and "demo" names both (the CLI's `--model demo`): a chat request
    # for "demo" was a 404 calling it "a speech-to-text model", the Whisper demo's aliases being checked first.
    from types import SimpleNamespace

    from engine.models import DEMO_MODEL_ID
    from service.chat.request import chat_engine
    from service.http.errors import APIError
    from service.state import AppState

    engine = FakeEngine()
    engine.model_name = DEMO_MODEL_ID
    state = AppState(engine=engine, speech=SimpleNamespace(model_name="tiny.en"),  # type: ignore[arg-type]
                     speech_aliases={"demo", "whisper-tiny.en"})
    assert chat_engine(state, "demo") is engine and chat_engine(state, DEMO_MODEL_ID) is engine
    with pytest.raises(APIError) as refused:
        chat_engine(state, "whisper-1")
    assert refused.value.status == 404 and "speech-to-text" in refused.value.message
    engine.model_name = "another-model"  # "demo" is the Whisper demo's name when the chat model is not the demo
    with pytest.raises(APIError) as refused:
        chat_engine(state, "demo")
    assert "speech-to-text" in refused.value.message
