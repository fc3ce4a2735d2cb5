"""service/chat/vllm_fields.py: vLLM's min_tokens, ignore_eos and spaces_between_special_tokens on chat and text
completions — taken as SillyTavern's "vLLM" text completion type sends them, passed to the engine, refused by name
where they cannot be honoured; /v1/messages does not take them, /v1/responses min_tokens and ignore_eos alone; vLLM's
top_k -1."""

from __future__ import annotations

from typing import Any

import pytest

from engine.request_checks import check_request
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]

# SillyTavern 1.19.0's Text Completion type "vLLM", its settings as they come: the three vLLM fields were a 400.
SILLYTAVERN_VLLM = {
    "prompt": "### Instruction:\nSay hi.\n### Response:\n", "model": "fake-model", "max_tokens": 300,
    "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "frequency_penalty": 0,
    "presence_penalty": 0, "min_tokens": 0, "stop": ["\n### Instruction:"], "skip_special_tokens": True, "n": 1,
    "ignore_eos": False, "spaces_between_special_tokens": True, "stream": True,
}


def _refused(response: Any, param: str, *words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and all(word in error["message"] for word in words), error


def test_sillytaverns_default_vllm_body_is_answered(client: Any, fake_engine: FakeEngine) -> None:
    events = sse_events(client.post("/v1/completions", json=SILLYTAVERN_VLLM).text)
    assert events[-1] == "[DONE]" and "".join(e["choices"][0]["text"] for e in events[:-1]) == "Hello world!"
    request = fake_engine.requests[-1]
    assert (request.min_tokens, request.ignore_eos, request.skip_special_tokens) == (0, False, True)
    whole = client.post("/v1/completions", json={**SILLYTAVERN_VLLM, "stream": False, "logprobs": 5})
    assert whole.status_code == 200, whole.text


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {"messages": USER}), ("/v1/completions",
                                                                                      {"prompt": "x"})])
def test_the_fields_reach_the_engine_request(client: Any, fake_engine: FakeEngine, path: str,
                                             body: dict[str, Any]) -> None:
    response = client.post(path, json={**body, "max_tokens": 8, "min_tokens": 3, "ignore_eos": True,
                                       "spaces_between_special_tokens": False})
    assert response.status_code == 200, response.text
    assert (fake_engine.requests[-1].min_tokens, fake_engine.requests[-1].ignore_eos) == (3, True)
    assert client.post(path, json=body).status_code == 200  # left out: neither asked
    assert (fake_engine.requests[-1].min_tokens, fake_engine.requests[-1].ignore_eos) == (0, False)


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/chat/completions", {"messages": USER, "min_tokens": 9, "max_tokens": 8}, "min_tokens", ("max_tokens (8)",)),
    ("/v1/chat/completions", {"messages": USER, "min_tokens": 9, "max_completion_tokens": 8}, "min_tokens", ()),
    ("/v1/completions", {"prompt": "x", "min_tokens": 17}, "min_tokens", ("max_tokens (16, the default)",)),
    ("/v1/completions", {"prompt": "x", "min_tokens": -1}, "min_tokens", ()),
    ("/v1/completions", {"prompt": "x", "ignore_eos": "yes"}, "ignore_eos", ()),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs", ()),
])
def test_what_cannot_be_honoured_is_refused_by_name(client: Any, fake_engine: FakeEngine, path: str,
                                                    body: dict[str, Any], param: str, words: tuple[str, ...]) -> None:
    _refused(client.post(path, json=body), param, *words)
    assert fake_engine.requests == []


@pytest.mark.parametrize("field", ["min_tokens", "ignore_eos"])
def test_beside_a_grammar_they_are_refused_by_name(client: Any, fake_engine: FakeEngine, monkeypatch: Any,
                                                   field: str) -> None:
    # The engine's check (engine/request_checks.py), as the real engine runs it at submit.
    submit = fake_engine.submit
    monkeypatch.setattr(fake_engine, "submit", lambda request: check_request(
        request, vocab_size=len(fake_engine.tokenizer), context_length=1 << 20) and submit(request))
    body = {"messages": USER, "response_format": {"type": "json_object"}, field: 1 if field == "min_tokens" else True}
    _refused(client.post("/v1/chat/completions", json=body), field, "grammar")
    assert client.post("/v1/chat/completions", json={**body, field: None}).status_code == 200


def test_legacy_logprobs_go_up_to_vllms_twenty(client: Any, fake_engine: FakeEngine) -> None:
    # SillyTavern's Generic type with "Request token probabilities" sends 10; OpenAI's cap of 5 refused it.
    for k in (10, 20):
        response = client.post("/v1/completions", json={"prompt": "x", "logprobs": k})
        assert response.status_code == 200, response.text
        assert fake_engine.requests[-1].sampling.logprobs == k


@pytest.mark.parametrize("field, value", [("min_tokens", 0), ("ignore_eos", False),
                                          ("spaces_between_special_tokens", True)])
def test_messages_does_not_take_them_and_responses_the_first_two(client: Any, field: str, value: Any) -> None:
    messages = client.post("/v1/messages", json={"max_tokens": 5, "messages": USER, field: value})
    assert messages.status_code == 400 and field in messages.json()["error"]["message"]
    responses = client.post("/v1/responses", json={"input": "hi", field: value})
    if field == "spaces_between_special_tokens":
        _refused(responses, field, "Unrecognized")
    else:  # as vLLM's Responses API takes ignore_eos (tests/service/responses/test_routes.py)
        assert responses.status_code == 200, responses.text


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {"messages": USER}),
                                        ("/v1/completions", {"prompt": "x"}), ("/v1/responses", {"input": "hi"})])
def test_top_k_minus_one_is_vllms_no_top_k(client: Any, fake_engine: FakeEngine, path: str,
                                           body: dict[str, Any]) -> None:
    # Older vLLM recipes pass -1; it overrides a recommended top_k as 0 does.
    fake_engine.sampling_defaults = {"top_k": 20}
    response = client.post(path, json={**body, "top_k": -1})
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].sampling.top_k == 0
    _refused(client.post(path, json={**body, "top_k": -2}), "top_k", "-1")
