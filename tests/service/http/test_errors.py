"""Every bad input gets a 4xx in OpenAI's error shape, and the server keeps serving afterwards."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.errors import InvalidSampling
from tests.service.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]

BAD_CHAT_BODIES: list[tuple[str, Any, int, str | None, str | None]] = [
    # (case, body, status, param, code)
    ("malformed_json", b'{"messages": [', 400, None, "invalid_json"),
    ("not_an_object", b"[1, 2]", 400, None, None),
    ("wrong_type", {"messages": "hi"}, 400, "messages", "invalid_value"),
    ("wrong_nested_type", {"messages": [{"role": "user", "content": 3}]}, 400, "messages.0.content", None),
    ("unknown_role", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role", "invalid_value"),
    ("missing_messages", {"model": "fake-model"}, 400, "messages", "invalid_value"),
    ("empty_messages", {"messages": []}, 400, "messages", "invalid_value"),
    ("unknown_model", {"model": "gpt-9", "messages": USER}, 404, "model", "model_not_found"),
    ("n_above_the_cap", {"messages": USER, "n": 65}, 400, "n", "invalid_value"),
    ("negative_max_tokens", {"messages": USER, "max_tokens": -1}, 400, "max_tokens", "invalid_value"),
    ("negative_max_completion_tokens", {"messages": USER, "max_completion_tokens": -5}, 400, "max_completion_tokens", None),
    ("temperature_out_of_range", {"messages": USER, "temperature": 9}, 400, "temperature", "invalid_value"),
    ("logit_bias_not_token_id", {"messages": USER, "logit_bias": {"hello": 1}}, 400, "logit_bias", "invalid_value"),
    ("logit_bias_outside_vocab", {"messages": USER, "logit_bias": {"999999": 1}}, 400, "logit_bias", None),
    ("image_part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, None, "invalid_value"),
    ("context_length_exceeded", {"messages": [{"role": "user", "content": "x" * 400}]}, 400, "messages",
     "context_length_exceeded"),
    ("template_rejects", {"messages": USER, "chat_template_kwargs": {"fail": True}}, 400, "messages", "invalid_messages"),
    ("client_template", {"messages": USER, "chat_template_kwargs": {"chat_template": "{{ 'x' * 2000000000 }}"}},
     400, "chat_template_kwargs.chat_template", "request_templates_disabled"),
    ("template_argument_as_variable", {"messages": USER, "chat_template_kwargs": {"tokenize": True}},
     400, "chat_template_kwargs.tokenize", "invalid_value"),
    ("nested_1000_deep", b'{"messages": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, None, "json_too_deep"),
    ("kwargs_nested_1000_deep", b'{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": '
     + b"[" * 1000 + b"]" * 1000 + b"}}", 400, None, "json_too_deep"),
]


def _assert_openai_error(response: Any, status: int, param: str | None, code: str | None) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and isinstance(body["error"]["message"], str)
    assert body["error"]["type"] == "invalid_request_error"
    if param is not None:
        assert body["error"]["param"] == param
    # Every error names a machine-readable code, never null (logit_bias, 413 and multipart ones were).
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    if code is not None:
        assert body["error"]["code"] == code
    assert "Traceback" not in response.text


@pytest.mark.parametrize("case,body,status,param,code", BAD_CHAT_BODIES, ids=[c[0] for c in BAD_CHAT_BODIES])
def test_bad_chat_request(client: Any, fake_engine: FakeEngine, case: str, body: Any, status: int,
                          param: str | None, code: str | None) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    _assert_openai_error(response, status, param, code)
    assert fake_engine.requests == []  # nothing reached the engine
    ok = client.post("/v1/chat/completions", json={"messages": USER})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "Hello world!"


BAD_COMPLETION_BODIES: list[tuple[str, Any, int, str | None, str | None]] = [
    ("missing_prompt", {"model": "fake-model"}, 400, "prompt", None),
    ("too_many_prompts", {"prompt": ["a"] * 65}, 400, "prompt", "invalid_value"),
    ("empty_token_list", {"prompt": []}, 400, "prompt", None),
    ("token_outside_vocab", {"prompt": [1, 10**9]}, 400, "prompt", None),
    ("unknown_model", {"model": "nope", "prompt": "a"}, 404, "model", "model_not_found"),
    ("n_above_the_cap", {"prompt": "a", "n": 65}, 400, "n", None),
    ("too_long", {"prompt": "y" * 300}, 400, "prompt", "context_length_exceeded"),
]


@pytest.mark.parametrize("case,body,status,param,code", BAD_COMPLETION_BODIES, ids=[c[0] for c in BAD_COMPLETION_BODIES])
def test_bad_completion_request(client: Any, case: str, body: Any, status: int, param: str | None, code: str | None) -> None:
    _assert_openai_error(client.post("/v1/completions", json=body), status, param, code)
    assert client.post("/v1/completions", json={"prompt": "a"}).status_code == 200


def test_unknown_route_and_method_are_openai_errors(client: Any) -> None:
    _assert_openai_error(client.get("/v1/nothing-here"), 404, None, "not_found")
    wrong_method = client.get("/v1/chat/completions")
    _assert_openai_error(wrong_method, 405, None, "method_not_allowed")
    assert "POST" in wrong_method.headers["allow"]  # RFC 9110: a 405 says which methods the route takes


def test_a_websocket_route_met_as_plain_http_says_to_upgrade(client: Any) -> None:
    # A reverse proxy that drops Upgrade / Connection made every Realtime connection a 405 blaming GET.
    r = client.get("/v1/realtime", params={"intent": "transcription"})
    _assert_openai_error(r, 426, None, "upgrade_required")
    assert r.headers["upgrade"] == "websocket" and "Upgrade and Connection" in r.json()["error"]["message"]
    assert client.post("/v1/audio/live").status_code == 405  # another method stays a 405


def test_what_other_servers_clients_send_gets_a_pointer(client: Any) -> None:
    # A base_url without /v1 (mlx_lm.server answers both paths), mlx_lm.server's and Ollama's fields, chat's
    # boolean logprobs on /v1/completions: each 4xx says where to go or why, not only what was wrong.
    missing_v1 = client.post("/chat/completions", json={})
    _assert_openai_error(missing_v1, 404, None, "not_found")
    assert "POST /v1/chat/completions" in missing_v1.json()["error"]["message"]
    assert "/v1" not in client.get("/nothing").json()["error"]["message"].split(")")[-1]
    body = {"messages": [{"role": "user", "content": "x"}], "draft_model": "small"}
    assert "no speculative decoding" in client.post("/v1/chat/completions", json=body).json()["error"]["message"]
    body = {"messages": [{"role": "user", "content": "x"}], "num_predict": 20}
    assert "send max_tokens" in client.post("/v1/chat/completions", json=body).json()["error"]["message"]
    counted = client.post("/v1/completions", json={"prompt": "x", "logprobs": True})
    _assert_openai_error(counted, 400, "logprobs", "invalid_value")
    assert "a count, 0 to 20" in counted.json()["error"]["message"]


def test_json_depth_is_checked_before_decoding_and_strings_do_not_count() -> None:
    from service.http.json_body import json_depth

    assert json_depth(b'{"a": [1, {"b": "[[[[[[[["}]}') == 3
    assert json_depth(b'"\\"[[') == 2  # an escaped backslash closes the string before the brackets
    assert json_depth(b"[" * 5000) == 5000 and json_depth(b"") == 0


def test_unexpected_exception_is_a_500_without_a_traceback(client: Any, fake_engine: FakeEngine) -> None:
    def explode(_: Any) -> Any:
        raise KeyError("internal detail")

    fake_engine.submit = explode  # type: ignore[method-assign]
    response = client.post("/v1/chat/completions", json={"messages": USER})
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"
    assert "internal detail" not in response.text and "Traceback" not in response.text


def test_engine_rejection_maps_to_400_naming_the_field(client: Any, fake_engine: FakeEngine) -> None:
    def reject(_: Any) -> Any:
        raise InvalidSampling("temperature must be >= 0", param="temperature")

    fake_engine.submit = reject  # type: ignore[method-assign]
    response = client.post("/v1/chat/completions", json={"messages": USER})
    _assert_openai_error(response, 400, "temperature", "invalid_value")


def test_no_chat_model_is_model_not_found() -> None:
    from litestar.testing import TestClient

    from service.app import create_app
    from service.state import AppState

    with TestClient(create_app(AppState())) as client:
        _assert_openai_error(client.post("/v1/chat/completions", json={"messages": USER}), 404, "model", "model_not_found")


def test_only_failures_a_retry_cannot_fix_tell_the_sdks_not_to_retry() -> None:
    # The openai SDKs retry 408, 409, 429 and every 5xx twice unless `x-should-retry` says otherwise.
    from audio.errors import SessionClosed, WhisperCheckpointError
    from engine.errors import EngineRestarting, QueueFull
    from service.http.errors import api_error, error_response, unavailable

    for final in (api_error(SessionClosed("finished")), api_error(WhisperCheckpointError("no such checkpoint"))):
        assert final.headers["x-should-retry"] == "false"
        assert error_response(final).headers["x-should-retry"] == "false"
    # A retry may succeed once the queue drains or the server is back: the SDKs' own rule (and Retry-After) stands.
    for passing in (api_error(QueueFull("full")), api_error(EngineRestarting("respawning")), unavailable("loading")):
        assert "x-should-retry" not in passing.headers and "Retry-After" in passing.headers
