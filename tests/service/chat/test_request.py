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
