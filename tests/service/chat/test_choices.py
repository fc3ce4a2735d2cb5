"""Several choices in one /v1/completions request: a list of prompts (lm-eval's `--batch_size`, which was a 400) and
`n` samples of each, every choice its own row, indexed as OpenAI indexes them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine

WHOLE = "Hello world!"  # the fake engine's reply


def test_prompts_and_samples_are_choices_in_openai_order(client: TestClient[Any], fake_engine: FakeEngine) -> None:
    answer = client.post("/v1/completions", json={"prompt": ["ab", "cde"], "n": 2})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert all(c["text"] == WHOLE and c["finish_reason"] == "stop" for c in body["choices"])
    assert [r.prompt_tokens for r in fake_engine.requests] == [[97, 98], [97, 98], [99, 100, 101], [99, 100, 101]]
    assert [r.choice for r in fake_engine.requests] == [0, 1, 2, 3]  # later choices wait behind others' first
    # One key for the request's rows: the queue limit counts them as one request.
    assert len({r.origin for r in fake_engine.requests}) == 1 and fake_engine.requests[0].origin is not None
    # Each prompt counted once however many samples it has (OpenAI's n); every sample's tokens counted.
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 4 * 5
    token_lists = client.post("/v1/completions", json={"prompt": [[5, 6], [7]], "echo": True}).json()
    assert [c["text"] for c in token_lists["choices"]] == ["\x05\x06" + WHOLE, "\x07" + WHOLE]


def test_streamed_choices_interleave_each_naming_its_index(client: TestClient[Any]) -> None:
    body = {"prompt": ["ab", "cde"], "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200 and response.text.count("data: [DONE]") == 1
    events = sse_events(response.text)[:-1]
    *chunks, usage = events
    texts: dict[int, str] = {}
    finishes: Counter[int] = Counter()
    for event in chunks:
        (choice,) = event["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        finishes[choice["index"]] += choice["finish_reason"] is not None
    assert texts == {i: WHOLE for i in range(4)} and finishes == {i: 1 for i in range(4)}
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 5
    assert usage["usage"]["completion_tokens"] == 20


def test_a_seed_gives_each_sample_its_own(client: TestClient[Any], fake_engine: FakeEngine) -> None:
    # One seed for all n samples would give n copies of one reply.
    client.post("/v1/completions", json={"prompt": "ab", "n": 3, "seed": 7, "temperature": 1})
    assert [r.sampling.seed for r in fake_engine.requests] == [7, 8, 9]
    client.post("/v1/completions", json={"prompt": "ab", "n": 2, "temperature": 1})
    assert [r.sampling.seed for r in fake_engine.requests[3:]] == [None, None]


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_choice_fails_the_request_and_frees_every_row(client: TestClient[Any], fake_engine: FakeEngine,
                                                                stream: bool) -> None:
    fake_engine.fail_with = "the device is gone"
    response = client.post("/v1/completions", json={"prompt": ["ab", "cd"], "n": 2, "stream": stream})
    if stream:  # failures past the first delta: an error event, then [DONE]
        assert response.status_code == 200
        events = sse_events(response.text)
        assert "the device is gone" in events[-2]["error"]["message"] and events[-1] == "[DONE]"
    else:
        assert response.status_code >= 500 and "the device is gone" in response.json()["error"]["message"]
    assert not fake_engine.active


def test_a_refused_prompt_frees_the_rows_already_submitted(client: TestClient[Any], fake_engine: FakeEngine) -> None:
    fake_engine.gate = __import__("anyio").Event()  # the first prompt's rows would wait: they must be closed
    response = client.post("/v1/completions", json={"prompt": ["ab", "x" * 300], "n": 2})
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert len(fake_engine.requests) == 2 and fake_engine.closed_streams == 2 and not fake_engine.active


def test_a_batch_of_prompts_gets_what_each_prompt_gets_alone(tiny_loaded: Any) -> None:
    # The real engine: rows of a batch side by side give each prompt the greedy reply it gets on its own.
    from engine.runtime import Engine
    from service.app import create_app
    from service.state import AppState

    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]
    body: dict[str, Any] = {"max_tokens": 5, "temperature": 0, "logprobs": 1, "echo": True}
    with TestClient(create_app(AppState(engine=Engine(tiny_loaded, max_iteration_tokens=8)))) as client:
        alone = [client.post("/v1/completions", json={**body, "prompt": p}).json()["choices"][0] for p in prompts]
        batch = client.post("/v1/completions", json={**body, "prompt": prompts}).json()["choices"]
    assert [c["text"] for c in batch] == [c["text"] for c in alone]
    assert [c["logprobs"]["tokens"] for c in batch] == [c["logprobs"]["tokens"] for c in alone]
    for got, want in zip(batch, alone):
        assert got["logprobs"]["token_logprobs"][1:] == pytest.approx(want["logprobs"]["token_logprobs"][1:], abs=2e-3)


HI = [{"role": "user", "content": "hi"}]


def test_n_chat_replies_render_once_and_run_side_by_side(client: TestClient[Any], fake_engine: FakeEngine) -> None:
    answer = client.post("/v1/chat/completions", json={"messages": HI, "n": 3})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == WHOLE and c["finish_reason"] == "stop" for c in body["choices"])
    assert len(fake_engine.tokenizer.template_calls) == 1 and len(fake_engine.requests) == 3
    assert [r.choice for r in fake_engine.requests] == [0, 1, 2]
    client.post("/v1/chat/completions", json={"messages": HI, "n": 2})
    assert len({r.origin for r in fake_engine.requests[:3]}) == 1 and len({r.origin for r in fake_engine.requests}) == 2
    assert len({tuple(r.prompt_tokens) for r in fake_engine.requests}) == 1
    prompt = len(fake_engine.requests[0].prompt_tokens)
    assert body["usage"] == {**body["usage"], "prompt_tokens": prompt, "completion_tokens": 15}


def test_n_chat_replies_stream_interleaved_each_opened_and_finished(client: TestClient[Any]) -> None:
    body = {"messages": HI, "n": 2, "stream": True, "stream_options": {"include_usage": True}, "seed": 3}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.text.count("data: [DONE]") == 1
    *chunks, usage = sse_events(response.text)[:-1]
    content: dict[int, str] = {}
    firsts: dict[int, dict[str, Any]] = {}
    finishes: Counter[int] = Counter()
    for event in chunks:
        (choice,) = event["choices"]
        firsts.setdefault(choice["index"], choice["delta"])
        content[choice["index"]] = content.get(choice["index"], "") + (choice["delta"].get("content") or "")
        finishes[choice["index"]] += choice["finish_reason"] is not None
    assert content == {0: WHOLE, 1: WHOLE} and finishes == {0: 1, 1: 1}
    assert all(first["role"] == "assistant" for first in firsts.values())  # each choice opens as OpenAI's does
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10


def test_a_seeded_chat_gives_each_sample_its_own_seed(client: TestClient[Any], fake_engine: FakeEngine) -> None:
    client.post("/v1/chat/completions", json={"messages": HI, "n": 2, "seed": 41})
    assert [r.sampling.seed for r in fake_engine.requests] == [41, 42]
    refused = client.post("/v1/chat/completions", json={"messages": HI, "n": 65})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"


def test_n_greedy_chat_replies_are_the_reply_alone(tiny_loaded: Any) -> None:
    # The real engine: n rows of one prompt side by side, each the greedy reply the prompt gets on its own.
    from engine.runtime import Engine
    from service.app import create_app
    from service.state import AppState

    body: dict[str, Any] = {"messages": HI, "max_tokens": 6, "temperature": 0}
    with TestClient(create_app(AppState(engine=Engine(tiny_loaded, max_iteration_tokens=8)))) as client:
        alone = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        three = client.post("/v1/chat/completions", json={**body, "n": 3}).json()["choices"]
    assert [c["message"] for c in three] == [alone] * 3


@pytest.mark.parametrize("route, body, param", [
    ("/v1/completions", {"prompt": "ab", "n": 21}, "n"),
    ("/v1/completions", {"prompt": ["ab"] * 21}, "prompt"),
    ("/v1/chat/completions", {"messages": HI, "n": 21}, "n"),
])
def test_more_choices_than_the_server_can_hold_are_a_400_not_a_429(route: str, body: dict[str, Any],
                                                                    param: str) -> None:
    # --max-active 16 and --max-queued 4 hold 20 rows: a 21-choice request got 429 queue_full on an idle server, which
    # the SDKs retried and could never pass.
    from service.app import create_app
    from service.config import ServiceConfig
    from service.state import AppState

    engine = FakeEngine()
    with TestClient(create_app(AppState(engine=engine, config=ServiceConfig(max_queued=4)))) as client:
        refused = client.post(route, json=body)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == param and error["code"] == "too_many_choices" and "(20:" in error["message"]
        assert "retry-after" not in refused.headers and not engine.requests
        fits = {**body, "n": 20} if "n" in body else {**body, "prompt": ["ab"] * 20}
        assert client.post(route, json=fits).status_code == 200


def test_several_prompts_times_n_are_counted_as_asked_and_name_n() -> None:
    # 4 prompts × n = 4 on a 12-row server was refused as "n: 16 choices", naming a count the client never sent.
    from service.app import create_app
    from service.config import ServiceConfig
    from service.state import AppState

    config = ServiceConfig(max_active=4, max_queued=8)
    with TestClient(create_app(AppState(engine=FakeEngine(), config=config))) as client:
        refused = client.post("/v1/completions", json={"prompt": ["a", "b", "c", "d"], "n": 4})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "n" and error["code"] == "too_many_choices"
    assert error["message"].startswith("n: 4 prompts × n = 4: 16 choices are more than this server runs and queues")


@pytest.mark.anyio
async def test_an_n_request_s_waiting_choices_leave_other_clients_their_queue_place(tiny_loaded: Any,
                                                                                    monkeypatch: Any) -> None:
    # --max-active 4 --max-queued 8: one n = 12 chat's 8 waiting choices took every place, and every other client got
    # 429 until it ended. Here one row and 3 places: an n = 4 chat runs its first choice, 3 wait; another client's
    # chat is queued, not refused, and runs before the n-request's later choices. The real engine, stepped by hand.
    import json

    import anyio

    from engine.batch import LLMBatchGroup
    from service.app import create_app
    from service.config import ServiceConfig
    from service.state import AppState
    from tests.engine.test_batch import iterate, make_group
    from tests.service.asgi import ASGIClient, asgi_scope

    group = make_group(tiny_loaded, max_active=1, max_queued=3)
    admitted: list[str] = []

    def admit() -> None:  # records who joins, in order
        before = list(group._active)
        LLMBatchGroup.admit(group)
        admitted.extend("B" if r.request.origin is None else f"A{r.request.choice}"
                        for r in group._active if r not in before)

    monkeypatch.setattr(group, "admit", admit)
    engine = FakeEngine()
    engine.submit = group.submit  # type: ignore[method-assign]
    app = create_app(AppState(engine=engine, ready=True, config=ServiceConfig(max_active=1, max_queued=3)))
    body: dict[str, Any] = {"messages": HI, "max_tokens": 3, "temperature": 0}
    big, other = ASGIClient({**body, "n": 4}), ASGIClient(body)
    with anyio.fail_after(60):  # a hang fails, not a timing
        async with anyio.create_task_group() as tg:
            tg.start_soon(app, asgi_scope("/v1/chat/completions"), big.receive, big.send)
            while group.queued_rows() < 4:  # each pass yields to the app task
                await anyio.lowlevel.checkpoint()
            await iterate(group)  # its first choice runs, the other three wait
            assert (group.active_rows(), group.queued_rows()) == (1, 3)
            tg.start_soon(app, asgi_scope("/v1/chat/completions"), other.receive, other.send)
            while group.queued_rows() < 4 and not other.leave.is_set():
                await anyio.lowlevel.checkpoint()
            while not (big.leave.is_set() and other.leave.is_set()):
                await iterate(group)
                await anyio.lowlevel.checkpoint()
    answer = json.loads(b"".join(other.chunks))
    assert "error" not in answer, answer
    assert len(answer["choices"]) == 1 and len(json.loads(b"".join(big.chunks))["choices"]) == 4
    assert admitted == ["A0", "B", "A1", "A2", "A3"]


def test_a_batch_of_prompts_scored_alone(client: TestClient[Any]) -> None:
    # max_tokens 0 with echo over a batch: each choice its prompt, no reply, no completion tokens.
    body = client.post("/v1/completions", json={"prompt": ["ab", "cde"], "max_tokens": 0, "echo": True}).json()
    assert [(c["text"], c["finish_reason"]) for c in body["choices"]] == [("ab", "length"), ("cde", "length")]
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == 5


def test_n_replies_to_a_long_prompt_prefill_it_once(tiny_loaded: Any) -> None:
    # Each of the n rows prefilled the whole prompt again (n = 8 of a 3,109-token prompt took 8.3x one): the prompt is
    # now prefilled once and the rows continue it from the prefix cache, their replies unchanged.
    from engine.prefix_cache import PrefixCache
    from engine.runtime import Engine
    from service.app import create_app
    from service.chat.choices import PRIME_MIN_TOKENS
    from service.state import AppState

    prompt = [1] + [(7 * i) % 200 + 5 for i in range(PRIME_MIN_TOKENS + 44)]
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
    engine = Engine(tiny_loaded, max_iteration_tokens=64, prefix_cache=PrefixCache(64 << 20))
    with TestClient(create_app(AppState(engine=engine))) as client:
        answer = client.post("/v1/completions", json={**body, "n": 3})
        fed = engine.stats()["prompt_tokens"]
        alone = client.post("/v1/completions", json=body)
    assert answer.status_code == 200 and alone.status_code == 200, answer.text
    assert fed < 2 * len(prompt), fed  # once, and the three rows' last tokens (three prefills: 3 x 301)
    replies = {c["text"] for c in answer.json()["choices"]}
    assert replies == {alone.json()["choices"][0]["text"]}  # the greedy reply, whoever prefilled the prompt
    # the request's writes into the cache are the primer's (the whole prompt): its choices' puts found the prompt held
    # (the last token, prefilled again after the hit, too); the same prompt again writes nothing either
    assert answer.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": len(prompt) - 1,
                                                               "cache_write_tokens": len(prompt)}
    assert alone.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": len(prompt) - 1,
                                                              "cache_write_tokens": 0}


def test_every_choices_cache_writes_count_in_the_usage(client: TestClient[Any], fake_engine: FakeEngine) -> None:
    # A row's cache_write_tokens are the prompt tokens its put stored that the cache did not hold (a sibling's put
    # finds those another stored first held): whichever sibling left first wrote them, counted once in the sum.
    fake_engine.cached_tokens, fake_engine.cache_write_tokens = 0, 3  # the fake's rows each say 3
    body = client.post("/v1/completions", json={"prompt": ["ab", "cde"], "n": 2}).json()
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 4 * 3}
