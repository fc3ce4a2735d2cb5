"""service/chat/logprobs.py: log probabilities asked for reach the engine and come back in OpenAI's shapes — a chat
choice's `logprobs.content` (streamed on the chunk whose text the token wrote), a text completion's legacy lists —
with each token's text from its tokenizer piece (tests/engine/test_token_pieces.py)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from litestar.testing import TestClient

from engine.contracts import Delta, TokenLogprob
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine, FakeStream, FakeTokenizer

USER = [{"role": "user", "content": "hi"}]
PIECES = ["Hel", "lo", " wor", "ld", "!"]  # the fake engine's reply; each piece's token is its first character


def _entry(token: str, i: int, k: int) -> dict[str, Any]:
    value = -(i + 1) / 10
    top = [{"token": chr(ord(token) + j), "logprob": pytest.approx(value - j), "bytes": list(chr(ord(token) + j).encode())}
           for j in range(k)]
    return {"token": token, "logprob": pytest.approx(value), "bytes": list(token.encode()), "top_logprobs": top}


def test_chat_logprobs_reach_the_engine_and_come_back_per_token(client: Any, fake_engine: FakeEngine) -> None:
    body = {"model": "fake-model", "messages": USER, "logprobs": True, "top_logprobs": 2}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].sampling.logprobs == 2
    choice = response.json()["choices"][0]
    assert choice["logprobs"]["content"] == [_entry(p[0], i, 2) for i, p in enumerate(PIECES)]

    events = sse_events(client.post("/v1/chat/completions", json={**body, "stream": True}).text)[:-1]
    carried = [(e["choices"][0]["delta"].get("content"), e["choices"][0]["logprobs"]) for e in events]
    assert carried[0] == ("", None)  # the role chunk
    texts = [(text, lp["content"]) for text, lp in carried[1:] if lp is not None]
    assert texts == [(p, [_entry(p[0], i, 2)]) for i, p in enumerate(PIECES)]


def test_without_logprobs_nothing_is_computed_or_sent(client: Any, fake_engine: FakeEngine) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "logprobs": False})
    assert response.json()["choices"][0]["logprobs"] is None
    assert fake_engine.requests[-1].sampling.logprobs is None
    events = sse_events(client.post("/v1/chat/completions", json={"messages": USER, "stream": True}).text)[:-1]
    assert all(e["choices"][0]["logprobs"] is None for e in events)


def test_logprobs_without_top_give_each_token_alone(client: Any, fake_engine: FakeEngine) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "logprobs": True})
    assert fake_engine.requests[-1].sampling.logprobs == 0
    content = response.json()["choices"][0]["logprobs"]["content"]
    assert [e["top_logprobs"] for e in content] == [[]] * len(PIECES)


def test_completion_logprobs_in_the_legacy_shape_with_text_offsets(client: Any, fake_engine: FakeEngine) -> None:
    response = client.post("/v1/completions", json={"prompt": "x", "logprobs": 1})
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].sampling.logprobs == 1
    logprobs = response.json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [p[0] for p in PIECES]
    assert logprobs["token_logprobs"] == pytest.approx([-(i + 1) / 10 for i in range(len(PIECES))])
    assert logprobs["top_logprobs"] == [{p[0]: pytest.approx(-(i + 1) / 10)} for i, p in enumerate(PIECES)]
    assert logprobs["text_offset"] == [0, 1, 2, 3, 4]  # where each token's text starts (here one character each)

    events = sse_events(client.post("/v1/completions", json={"prompt": "x", "logprobs": 0, "stream": True}).text)[:-1]
    streamed = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["text"]]
    assert [lp["text_offset"] for lp in streamed] == [[0], [1], [2], [3], [4]]


class _ByteTokenizer(FakeTokenizer):
    """The fake tokenizer with pieces that are bytes, partial UTF-8 characters among them (engine/token_pieces.py
    reads a detokenizer's `tokenmap` of bytes as such)."""

    def __init__(self, pieces: dict[int, bytes]) -> None:
        super().__init__()
        self._detokenizer = SimpleNamespace(tokenmap=[pieces.get(i, chr(i).encode()) for i in range(self.vocab)])


class _ScriptedStream(FakeStream):
    """Deltas given whole, as the engine sends them: a token inside a character waits for the delta whose text
    completes it."""

    def __init__(self, engine: FakeEngine, request: Any, deltas: list[Delta]) -> None:
        super().__init__(engine, request, [d.text for d in deltas])
        self.deltas = deltas

    async def __anext__(self) -> Delta:
        if self._sent >= len(self.deltas):
            raise StopAsyncIteration
        self._sent += 1
        return self.deltas[self._sent - 1]


# " 龍, snake": 龍 is E9 BE 8D, split over three tokens (ids 0x2000 on), the space riding on the first.
_SPLIT = {0x2000: b" \xe9", 0x2001: b"\xbe", 0x2002: b"\x8d", 0x2003: b" snake"}


def _split_reply(engine: FakeEngine) -> None:
    engine.tokenizer = _ByteTokenizer(_SPLIT)

    def submit(request: Any) -> _ScriptedStream:
        engine.requests.append(request)
        ids = [0x2000, 0x2001, 0x2002, 44, 0x2003]
        lp = [TokenLogprob(t, -0.5 - n, ((ord("x"), -0.1),)) for n, t in enumerate(ids)]
        deltas = [Delta(text=" ", token_ids=[0x2000], logprobs=lp[:1]), Delta(text="龍", token_ids=[0x2001, 0x2002],
                  logprobs=lp[1:3]), Delta(text=",", token_ids=[44], logprobs=lp[3:4]),
                  Delta(text=" snake", token_ids=[0x2003], logprobs=lp[4:], finish_reason="stop")]
        return _ScriptedStream(engine, request, deltas)

    engine.submit = submit  # type: ignore[method-assign]


def test_completion_tokens_split_inside_a_character_are_bytes_and_offsets_index_the_text(
        client: Any, fake_engine: FakeEngine) -> None:
    # OpenAI names a token that is no whole text `bytes:\xNN`; offsets count the characters before it, so a token
    # inside 龍 starts where 龍 does and "," is at the index it has in the text (they drifted: each piece read '�').
    _split_reply(fake_engine)
    names = ["bytes: \\xe9", "bytes:\\xbe", "bytes:\\x8d", ",", " snake"]
    choice = client.post("/v1/completions", json={"prompt": "x", "logprobs": 1}).json()["choices"][0]
    assert choice["text"] == " 龍, snake"
    assert choice["logprobs"]["tokens"] == names
    assert choice["logprobs"]["text_offset"] == [0, 1, 1, 2, 3]
    assert choice["text"][2] == ","
    events = sse_events(client.post("/v1/completions", json={"prompt": "x", "logprobs": 1, "stream": True}).text)[:-1]
    streamed = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    assert [t for lp in streamed for t in lp["tokens"]] == names
    assert [lp["text_offset"] for lp in streamed] == [[0], [1, 1], [2], [3]]


def test_the_sampled_token_is_always_among_top_logprobs(client: Any, fake_engine: FakeEngine) -> None:
    # OpenAI: "The API will always return the logprob of the sampled token, so there may be up to logprobs+1
    # elements"; `logprobs: 0` gives the sampled token alone.
    _split_reply(fake_engine)
    top = client.post("/v1/completions", json={"prompt": "x", "logprobs": 1}).json()["choices"][0]["logprobs"]
    assert top["top_logprobs"][3] == {"x": pytest.approx(-0.1), ",": pytest.approx(-3.5)}
    fake_engine.pieces = ["Hel", "lo"]
    fake_engine.submit = FakeEngine.submit.__get__(fake_engine)  # type: ignore[method-assign]
    alone = client.post("/v1/completions", json={"prompt": "x", "logprobs": 0}).json()["choices"][0]["logprobs"]
    assert alone["top_logprobs"] == [{"H": pytest.approx(-0.1)}, {"l": pytest.approx(-0.2)}]


def test_echo_with_logprobs_scores_the_prompt_in_the_legacy_shape(client: Any, fake_engine: FakeEngine) -> None:
    # What lm-eval's loglikelihood tasks send; they read token_logprobs[ctxlen:-1] and top_logprobs[ctxlen:-1]. The
    # first prompt token has null entries (OpenAI's, vLLM's); offsets count from the echoed prompt's start.
    body = {"prompt": "ab c", "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].prompt_logprobs == 1
    choice = response.json()["choices"][0]
    assert choice["text"] == "ab cHel"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["a", "b", " ", "c", "H"]
    assert lp["token_logprobs"][0] is None and lp["token_logprobs"][1:] == pytest.approx([-0.01, -0.02, -0.03, -0.1])
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1] == {"c": pytest.approx(-1.01), "b": pytest.approx(-0.01)}  # its own beside the top 1
    assert lp["text_offset"] == [0, 1, 2, 3, 4]

    events = sse_events(client.post("/v1/completions", json={**body, "stream": True}).text)[:-1]
    first = events[0]["choices"][0]
    assert first["text"] == "ab c" and first["logprobs"]["tokens"] == ["a", "b", " ", "c"]
    assert first["logprobs"]["token_logprobs"][0] is None and first["logprobs"]["text_offset"] == [0, 1, 2, 3]
    assert events[1]["choices"][0]["logprobs"]["text_offset"] == [4]


def test_prompt_logprobs_only_with_echo_and_a_failure_when_they_do_not_come(client: Any,
                                                                             fake_engine: FakeEngine) -> None:
    client.post("/v1/completions", json={"prompt": "ab", "logprobs": 1})
    assert fake_engine.requests[-1].prompt_logprobs is None
    client.post("/v1/completions", json={"prompt": "ab", "echo": True})
    assert fake_engine.requests[-1].prompt_logprobs is None
    fake_engine.submit = lambda request: FakeEngine.submit(fake_engine, replace(request, prompt_logprobs=None))
    lost = client.post("/v1/completions", json={"prompt": "ab", "logprobs": 0, "echo": True})
    assert lost.status_code == 500 and "did not come back" in lost.json()["error"]["message"]


def test_echoed_prompt_scored_by_the_tiny_model_lines_up_with_its_text(tiny_loaded: Any) -> None:
    # The real engine and app: the prompt's entries are its tokens (a split character's as bytes:), their offsets
    # index the echoed text, and the first token's log probability follows from one forward over the prompt.
    import mlx.core as mx

    from engine.runtime import Engine
    from service.app import create_app
    from service.state import AppState

    text = "Café, naïve, 日本語 🙂 and the"
    prompt = tiny_loaded.tokenizer.encode(text)
    body = {"prompt": text, "max_tokens": 2, "logprobs": 2, "echo": True, "temperature": 0}
    with TestClient(create_app(AppState(engine=Engine(tiny_loaded, max_iteration_tokens=8)))) as client:
        whole = client.post("/v1/completions", json=body).json()["choices"][0]
        streamed = sse_events(client.post("/v1/completions", json={**body, "stream": True}).text)[:-1]
    lp = whole["logprobs"]
    assert whole["text"].startswith(text) and len(lp["tokens"]) >= len(prompt) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert any(t.startswith("bytes:") for t in lp["tokens"][:len(prompt)])
    for token, at in zip(lp["tokens"], lp["text_offset"]):
        if not token.startswith("bytes:"):
            assert whole["text"][at:at + len(token)] == token
    logits = tiny_loaded.model(mx.array([prompt]))[0].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    expected = [float(logp[i, t]) for i, t in enumerate(prompt[1:])]
    assert lp["token_logprobs"][1:len(prompt)] == pytest.approx(expected, abs=2e-3)
    assert all(len(top) in (2, 3) for top in lp["top_logprobs"][1:])
    # Streamed: the prompt's entries come with the echo, the reply's after them, offsets going on.
    chunks = [e["choices"][0]["logprobs"] for e in streamed if e["choices"][0]["logprobs"]]
    assert chunks[0]["tokens"] == lp["tokens"][:len(prompt)]
    assert [o for c in chunks for o in c["text_offset"]] == lp["text_offset"]


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero_with_echo_scores_the_prompt_alone(client: Any, fake_engine: FakeEngine, stream: bool) -> None:
    # OpenAI's scoring idiom (max_tokens 0, echo, logprobs): the prompt and its log probabilities, no reply; a 400 before.
    body = {"prompt": "abc", "max_tokens": 0, "echo": True, "logprobs": 1, "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {})}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].max_tokens == 1 and fake_engine.requests[-1].prompt_logprobs == 1
    if stream:
        events = sse_events(response.text)[:-1]
        *chunks, usage = events
        text = "".join(e["choices"][0]["text"] for e in chunks)
        tokens = [t for e in chunks if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["tokens"]]
        finish = chunks[-1]["choices"][0]["finish_reason"]
        usage = usage["usage"]
    else:
        choice = response.json()["choices"][0]
        text, tokens, finish = choice["text"], choice["logprobs"]["tokens"], choice["finish_reason"]
        usage = response.json()["usage"]
    assert text == "abc" and tokens == ["a", "b", "c"] and finish == "length"
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == 3
    refused = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 0})
    assert refused.status_code == 400 and "echo" in refused.json()["error"]["message"]


@pytest.mark.parametrize("skip", [True, False])
def test_offsets_do_not_move_past_special_tokens_the_text_leaves_out(tiny_loaded: Any, skip: bool) -> None:
    # A reply biased into <|im_start|>: left out of the text by default, so every offset after it stays put (they
    # moved 13 characters a token, pointing past the text's end); kept with skip_special_tokens false.
    from engine.runtime import Engine
    from service.app import create_app
    from service.state import AppState

    special = tiny_loaded.tokenizer.convert_tokens_to_ids("<|im_start|>")
    body = {"prompt": "hello", "max_tokens": 3, "logprobs": 0, "temperature": 0, "logit_bias": {str(special): 100},
            "skip_special_tokens": skip}
    with TestClient(create_app(AppState(engine=Engine(tiny_loaded)))) as client:
        for stream in (False, True):
            answer = client.post("/v1/completions", json={**body, "stream": stream})
            events = sse_events(answer.text)[:-1] if stream else [answer.json()]
            text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
            offsets = [o for e in events if e["choices"] and e["choices"][0]["logprobs"]
                       for o in e["choices"][0]["logprobs"]["text_offset"]]
            assert offsets == ([0, 0, 0] if skip else [0, 12, 24]), (stream, text)
            assert text == ("" if skip else "<|im_start|>" * 3)


def _tiny_client(tiny_loaded: Any) -> TestClient[Any]:
    from engine.runtime import Engine
    from service.app import create_app
    from service.state import AppState

    return TestClient(create_app(AppState(engine=Engine(tiny_loaded))))


def _chat(client: TestClient[Any], body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A chat reply's (content, choice) read whole, then streamed (content joined, the last chunk's choice with the
    streamed logprobs entries and content deltas)."""
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    events = sse_events(client.post("/v1/chat/completions", json={**body, "stream": True}).text)[:-1]
    choices = [e["choices"][0] for e in events if e["choices"]]
    deltas = [c["delta"]["content"] for c in choices if c["delta"].get("content")]
    entries = [x for c in choices if c["logprobs"] for x in c["logprobs"]["content"]]
    streamed = {"finish_reason": choices[-1]["finish_reason"], "logprobs": {"content": entries}, "deltas": deltas}
    return [(whole["message"]["content"], whole), ("".join(deltas), streamed)]


def test_a_chat_reply_starting_with_a_space_keeps_it_as_its_logprobs_do(tiny_loaded: Any) -> None:
    # A byte-level BPE reply's first token " the": content lost its space ("the the") while its logprobs' tokens
    # and bytes kept it; a text completion kept it already.
    tok = tiny_loaded.tokenizer
    spaced = tok.encode(" the", add_special_tokens=False)[0]
    assert tok.decode([spaced]).startswith(" ")
    body = {"messages": USER, "max_tokens": 2, "temperature": 0, "logit_bias": {str(spaced): 100}, "logprobs": True}
    with _tiny_client(tiny_loaded) as client:
        for content, choice in _chat(client, body):
            tokens = [e["token"] for e in choice["logprobs"]["content"]]
            assert content == "".join(tokens) == tok.decode([spaced] * 2), (content, tokens)
            assert bytes(b for e in choice["logprobs"]["content"] for b in e["bytes"]).decode() == content
        text = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0,
                                                    "logit_bias": {str(spaced): 100}, "logprobs": 0}).json()["choices"][0]
        assert text["text"] == "".join(text["logprobs"]["tokens"]) == tok.decode([spaced] * 2)


def test_a_reply_the_limit_cuts_inside_a_character_ends_without_it_and_keeps_its_logprobs(tiny_loaded: Any) -> None:
    # A reply cut after a character's first byte ended "\ufffd" (streamed: a last delta of it), which a stop string
    # "\ufffd" matched, turning "length" into "stop"; that token's log probability still names its byte.
    from tests.engine.test_stop_matcher import byte_tokens

    tok = tiny_loaded.tokenizer
    lead = byte_tokens(tok, "日".encode()[:1])[0]
    body = {"messages": USER, "max_tokens": 1, "temperature": 0, "logit_bias": {str(lead): 100}, "logprobs": True}
    with _tiny_client(tiny_loaded) as client:
        for stop in (None, ["\ufffd"]):
            for content, choice in _chat(client, {**body, "stop": stop}):
                assert (content, choice["finish_reason"]) == ("", "length"), (stop, choice)
                assert [e["bytes"] for e in choice["logprobs"]["content"]] == [[0xE6]]  # (its token: "\ufffd")
        text = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "temperature": 0,
                                                    "logit_bias": {str(lead): 100}, "stop": ["\ufffd"]})
        assert (text.json()["choices"][0]["text"], text.json()["choices"][0]["finish_reason"]) == ("", "length")


def test_an_echoed_token_prompt_ending_inside_a_character_is_finished_by_the_reply(tiny_loaded: Any) -> None:
    # Prompt "Hi" + " 日"'s first bytes, reply "日"'s last: echoed "Hi \ufffd" + "\ufffd" (each decoded alone); one
    # decode of the two writes "Hi 日", streamed as the prompt's finished text then the character.
    from tests.engine.test_stop_matcher import byte_tokens

    tok = tiny_loaded.tokenizer
    prompt = tok.encode("Hi", add_special_tokens=False) + byte_tokens(tok, " 日".encode()[:3])
    last = byte_tokens(tok, "日".encode()[2:])[0]
    body = {"prompt": [prompt], "max_tokens": 1, "echo": True, "temperature": 0, "logit_bias": {str(last): 100},
            "logprobs": 1}
    with _tiny_client(tiny_loaded) as client:
        whole = client.post("/v1/completions", json=body).json()["choices"][0]
        events = sse_events(client.post("/v1/completions", json={**body, "stream": True}).text)[:-1]
        plain = client.post("/v1/completions", json={**body, "echo": False}).json()["choices"][0]
    assert whole["text"] == "Hi 日" and whole["logprobs"]["text_offset"][-1] == len("Hi ")  # where 日 starts
    texts = [e["choices"][0]["text"] for e in events if e["choices"] and e["choices"][0]["text"]]
    assert texts == ["Hi ", "日"]
    assert plain["text"] == "日"
