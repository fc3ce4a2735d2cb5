"""The official openai SDK against a live `tandem serve` on the tiny model: grammar, usage, stop strings,
errors, and a client that disconnects mid-stream frees its row while other streams complete."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import jinja2
import openai
import pytest
from tokenizers import Tokenizer

from tests.e2e.conftest import TandemServer
from tests.fixtures.tiny_llm import CHATML_TEMPLATE

MESSAGES = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Hello world! What is the answer?"}]


@pytest.fixture(scope="module")
def client(tiny_server: TandemServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer(tiny_llm_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_llm_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def no_eos(tokenizer: Tokenizer) -> dict[str, int]:
    """logit_bias that forbids the end-of-turn token, so a reply runs to max_tokens."""
    return {str(tokenizer.token_to_id("<|im_end|>")): -100}


def _prompt_tokens(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> int:
    text = jinja2.Template(CHATML_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def _stream(client: openai.OpenAI, model: str, **kwargs: Any) -> list[Any]:
    return list(client.chat.completions.create(model=model, messages=MESSAGES, stream=True, **kwargs))


def test_stream_grammar_and_usage(client: openai.OpenAI, model_id: str, tokenizer: Tokenizer, no_eos: dict[str, int]) -> None:
    chunks = _stream(client, model_id, max_completion_tokens=12, temperature=0, logit_bias=no_eos,
                     stream_options={"include_usage": True})
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(finishes) == 1 and finishes[0].choices[0].finish_reason == "length"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and chunks[-2] is finishes[0]
    assert usage_chunk.usage.prompt_tokens == _prompt_tokens(tokenizer, MESSAGES)
    assert usage_chunk.usage.completion_tokens == 12
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + 12
    assert all(c.id == chunks[0].id and c.model == model_id for c in chunks)


def test_non_stream_equals_greedy_stream(client: openai.OpenAI, model_id: str, no_eos: dict[str, int]) -> None:
    chunks = _stream(client, model_id, max_tokens=16, temperature=0, logit_bias=no_eos)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=16, temperature=0,
                                           logit_bias=no_eos)
    assert reply.choices[0].message.content == streamed
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 16


def test_stop_string_ends_the_reply_before_it(client: openai.OpenAI, model_id: str, no_eos: dict[str, int]) -> None:
    free = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=40, temperature=0,
                                          logit_bias=no_eos).choices[0].message.content or ""
    # A two-character stop string first seen at position p >= 1: the reply must be exactly free[:p].
    candidates = [p for p in range(1, len(free) - 1)
                  if free[p:p + 2].isascii() and free[p:p + 2].isprintable() and free.find(free[p:p + 2]) == p]
    assert candidates, f"no usable stop string in {free!r}"
    p = candidates[0]
    stop = free[p:p + 2]
    chunks = _stream(client, model_id, max_tokens=40, temperature=0, logit_bias=no_eos, stop=[stop])
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == free[:p]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    reply = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=40, temperature=0,
                                           logit_bias=no_eos, stop=stop)
    assert reply.choices[0].message.content == free[:p] and reply.choices[0].finish_reason == "stop"


def test_text_completion(client: openai.OpenAI, model_id: str, tokenizer: Tokenizer, no_eos: dict[str, int]) -> None:
    prompt = "The quick brown fox"
    reply = client.completions.create(model=model_id, prompt=prompt, max_tokens=5, temperature=0, logit_bias=no_eos)
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(tokenizer.encode(prompt).ids) and reply.usage.completion_tokens == 5
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt=prompt, max_tokens=5, temperature=0, logit_bias=no_eos, stream=True) if c.choices)
    assert streamed == reply.choices[0].text


def test_errors_reach_the_sdk_in_openai_shape(client: openai.OpenAI, model_id: str) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model_id, messages=MESSAGES, n=65)
    assert bad.value.param == "n"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hello " * 3000}])
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=[])
    raw = httpx.post(f"{client.base_url}chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}
    assert client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=2).choices[0].finish_reason


def test_disconnect_mid_stream_frees_the_row(client: openai.OpenAI, model_id: str, tiny_server: TandemServer,
                                             no_eos: dict[str, int]) -> None:
    before = tiny_server.stats()
    leaving = client.chat.completions.create(model=model_id, messages=MESSAGES, stream=True, max_tokens=1500,
                                             logit_bias=no_eos)
    events = iter(leaving)
    next(events), next(events)  # role chunk and first content: the row is decoding

    other_started = threading.Event()
    other: dict[str, Any] = {}

    def run_other() -> None:
        try:
            chunks = []
            for chunk in client.chat.completions.create(model=model_id, messages=MESSAGES, stream=True, max_tokens=300,
                                                        logit_bias=no_eos, stream_options={"include_usage": True}):
                chunks.append(chunk)
                other_started.set()
            other["chunks"] = chunks
        except Exception as exc:  # reported by the assertions below
            other["error"] = exc
        finally:
            other_started.set()

    thread = threading.Thread(target=run_other)
    thread.start()
    assert other_started.wait(120)
    leaving.close()  # the client goes away mid-stream

    # Bounded polling of /stats: the cancelled row must be gone within a few iterations.
    stats = _poll(tiny_server, lambda s: s["cancelled_rows"] > before["cancelled_rows"])
    assert stats["cancelled_rows"] == before["cancelled_rows"] + 1, stats

    thread.join(120)
    assert "error" not in other, other.get("error")
    chunks = other["chunks"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 300
    stats = _poll(tiny_server, lambda s: s["active_rows"] == 0)
    assert stats["active_rows"] == 0 and stats["queued_rows"] == 0, stats
    assert stats["generation_tokens"] - before["generation_tokens"] < 1500 + 300  # the left row stopped early


def _poll(server: TandemServer, done: Any) -> dict[str, Any]:
    """Poll /stats until done(stats), at most 400 times with short waits; return the last stats."""
    wait = threading.Event()
    stats = server.stats()
    for _ in range(400):
        if done(stats):
            break
        wait.wait(0.05)
        stats = server.stats()
    return stats


def test_disconnect_during_non_stream_request_frees_the_row(model_id: str, tiny_server: TandemServer,
                                                            no_eos: dict[str, int]) -> None:
    before = tiny_server.stats()
    body = json.dumps({"model": model_id, "messages": MESSAGES, "max_tokens": 1900, "logit_bias": no_eos}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", tiny_server.port)) as sock:
        sock.sendall(head + body)
        running = _poll(tiny_server, lambda s: s["active_rows"] >= 1)
        assert running["active_rows"] >= 1, running
    stats = _poll(tiny_server, lambda s: s["cancelled_rows"] > before["cancelled_rows"] and s["active_rows"] == 0)
    assert stats["cancelled_rows"] == before["cancelled_rows"] + 1 and stats["active_rows"] == 0, stats


def test_server_log_has_no_traceback(tiny_server: TandemServer) -> None:
    assert "Traceback" not in "".join(tiny_server.log), tiny_server.output()


def test_startup_objects_are_frozen_out_of_collections(tiny_server: TandemServer) -> None:
    gc_stats = tiny_server.stats()["gc"]  # `tandem serve` freezes by default (--gc-freeze)
    assert gc_stats["frozen_objects"] > 10_000 and len(gc_stats["generations"]) == 3
