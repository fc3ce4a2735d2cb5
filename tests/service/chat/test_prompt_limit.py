"""A prompt too long for one request — past the model's context, or past what --memory-budget holds for one
request — is refused in the words coding agents read to compact their conversation, naming the lower limit."""

from __future__ import annotations

import re
from typing import Any

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.service.fake_engine import FakeEngine

# opencode's provider/error.ts and pi-ai's utils/overflow.ts (the patterns an OpenAI-compatible server's 400 can meet),
# and Claude Code's parse of Anthropic's sentence (errors.ts: the token counts it sizes the compaction by).
AGENT_OVERFLOW = [re.compile(r"maximum context length is \d+ tokens", re.I),
                  re.compile(r"context[_ ]length[_ ]exceeded", re.I)]
CLAUDE_CODE = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)
LONG = [{"role": "user", "content": "x" * 300}]  # past a 200-token context's bound on characters: refused untokenized
SHORTER = [{"role": "user", "content": "x" * 183}]  # within it, but it renders to 200 tokens: none left
MESSAGES = {"model": "fake-model", "max_tokens": 8}


def _post(engine: FakeEngine, path: str, body: dict[str, Any]) -> Any:
    with TestClient(create_app(AppState(engine=engine))) as client:
        response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    return response.json()["error"]


def _prompt(path: str, body: dict[str, Any]) -> int:
    """The tokens of the prompt `body` renders to on `path` (one per character)."""
    engine = FakeEngine(context_length=4096)
    with TestClient(create_app(AppState(engine=engine))) as client:
        assert client.post(path, json=body).status_code == 200
    return len(engine.requests[-1].prompt_tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_past_the_memory_budget_agents_read_a_context_overflow_and_the_code_stays(stream: bool) -> None:
    # The engine's "the prompt (3520 tokens) does not fit the memory budget … at most 3328 prompt tokens fit" matched
    # no agent's overflow pattern: opencode and pi showed an error instead of compacting.
    engine = FakeEngine(context_length=8192)
    engine.budget_fits = 100
    error = _post(engine, "/v1/chat/completions", {"messages": LONG, "stream": stream})
    assert (error["type"], error["code"], error["param"]) == ("memory_admission", "context_over_budget", "messages")
    assert any(p.search(error["message"]) for p in AGENT_OVERFLOW), error["message"]
    assert "maximum context length is 100 tokens" in error["message"] and "8192" in error["message"]
    assert engine.requests == []  # refused before the engine


@pytest.mark.parametrize("messages", [LONG, SHORTER])
def test_past_both_limits_the_lower_is_named(messages: list[dict[str, str]]) -> None:
    # A prompt past the model's context named the context (8192) where the budget allows fewer tokens.
    engine = FakeEngine(context_length=200)
    engine.budget_fits = 100
    error = _post(engine, "/v1/chat/completions", {"messages": messages})
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 100 tokens under this server's memory budget" in error["message"], error
    assert ("characters" in error["message"]) == (messages is LONG)  # refused before tokenizing, or after


def test_past_the_context_alone_the_context_is_named() -> None:
    error = _post(FakeEngine(context_length=200), "/v1/completions", {"prompt": "y" * 200})
    assert (error["code"], error["type"]) == ("context_length_exceeded", "invalid_request_error")
    assert error["message"] == "This model's maximum context length is 200 tokens, but the prompt has 200 tokens."
    prompt = _prompt("/v1/chat/completions", {"messages": SHORTER})
    error = _post(FakeEngine(context_length=200), "/v1/chat/completions", {"messages": SHORTER})
    assert error["message"] == f"This model's maximum context length is 200 tokens, but the prompt has {prompt} tokens."


@pytest.mark.parametrize("context,fits,maximum", [(200, None, 199), (8192, 100, 99), (200, 100, 99)])
def test_on_messages_a_long_prompt_is_anthropics_prompt_is_too_long(context: int, fits: int | None,
                                                                     maximum: int) -> None:
    # Claude Code compacts on Anthropic's sentence and sizes the cut by its two numbers.
    body = {**MESSAGES, "messages": SHORTER}
    prompt = _prompt("/v1/messages", body)
    engine = FakeEngine(context_length=context)
    engine.budget_fits = fits
    with TestClient(create_app(AppState(engine=engine))) as client:
        response = client.post("/v1/messages", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"prompt is too long: {prompt} tokens > {maximum} maximum"), error["message"]
    match = CLAUDE_CODE.search(error["message"])
    assert match is not None and (int(match[1]), int(match[2])) == (prompt, maximum)


def test_on_messages_text_refused_before_tokenizing_is_too_long_too() -> None:
    # The fewest tokens its characters make (a token holds at most 1 of the fake vocabulary's characters).
    error = _post(FakeEngine(context_length=200), "/v1/messages", {**MESSAGES, "messages": LONG})
    match = CLAUDE_CODE.search(error["message"])
    assert error["message"].startswith("prompt is too long") and match is not None, error["message"]
    assert int(match[1]) > int(match[2]) == 199


def test_a_prompt_that_fits_both_is_served() -> None:
    prompt = _prompt("/v1/chat/completions", {"messages": LONG})
    engine = FakeEngine(context_length=8192)
    engine.budget_fits = prompt + 1  # the longest request: the prompt and one more token
    with TestClient(create_app(AppState(engine=engine))) as client:
        assert client.post("/v1/chat/completions", json={"messages": LONG}).status_code == 200
