"""`suffix` on /v1/completions (editor autocomplete): a code model's fill-in-the-middle prompt built from its FIM
tokens, the reply the text between; a model without them, and the combinations that make no sense, refused by
name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.fixtures.fim_tokenizers import QWEN_FIM, STARCODER_FIM, with_added_tokens
from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine

PREFIX, SUFFIX = "def f(a", "):\n    return a"


def _client(engine: Any) -> TestClient[Any]:
    return TestClient(create_app(AppState(engine=engine)))


@pytest.fixture(params=[QWEN_FIM, STARCODER_FIM], ids=["qwen", "starcoder"])
def fim_tokens(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """A family's FIM tokens: prefix, suffix, middle, then one that ends the middle."""
    return tuple(request.param)


@pytest.fixture
def fim_engine(fim_tokens: tuple[str, ...], tiny_llm_dir: Path, tmp_path: Path) -> FakeEngine:
    """The scripted engine holding a real tokenizer with the family's FIM tokens."""
    engine = FakeEngine(["    ", "pass"], context_length=4096)
    engine.tokenizer = with_added_tokens(tiny_llm_dir, tmp_path, fim_tokens)
    engine.vocab_size = len(engine.tokenizer)
    return engine


def _expected(tokenizer: Any, fim_tokens: tuple[str, ...], prefix: str, suffix: str) -> list[int]:
    """`<prefix>{prefix}<suffix>{suffix}<middle>`, the markers as their ids, the texts as text."""
    pre, suf, mid = (tokenizer.convert_tokens_to_ids(t) for t in fim_tokens[:3])
    text = lambda s: list(tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
    return [pre, *text(prefix), suf, *text(suffix), mid]


def test_the_engine_gets_the_family_s_fim_prompt_and_the_reply_is_the_middle(fim_engine: FakeEngine,
                                                                             fim_tokens: tuple[str, ...]) -> None:
    tokenizer = fim_engine.tokenizer
    with _client(fim_engine) as client:
        answer = client.post("/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 8})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == "    pass"
    sent = fim_engine.requests[-1]
    assert sent.prompt_tokens == _expected(tokenizer, fim_tokens, PREFIX, SUFFIX)
    assert answer.json()["usage"]["prompt_tokens"] == len(sent.prompt_tokens)
    # the family's end of the middle stops the row, beside eos
    assert tokenizer.convert_tokens_to_ids(fim_tokens[3]) in sent.stop_token_ids


def test_each_prompt_and_sample_gets_its_own_fim_prompt(fim_engine: FakeEngine, fim_tokens: tuple[str, ...]) -> None:
    tokenizer = fim_engine.tokenizer
    with _client(fim_engine) as client:
        answer = client.post("/v1/completions", json={"prompt": ["a = ", "b = "], "suffix": "\n", "n": 2,
                                                      "stream": True})
    assert answer.status_code == 200, answer.text
    assert sse_events(answer.text)[-1] == "[DONE]"
    rows = [r for r in fim_engine.requests if r.choice is not None]
    assert sorted(r.choice for r in rows) == [0, 1, 2, 3]
    for row in rows:
        assert row.prompt_tokens == _expected(tokenizer, fim_tokens, ["a = ", "b = "][row.choice // 2], "\n")


def test_a_fim_model_answers_a_suffix_through_the_real_app(tmp_path: Path) -> None:
    # The real engine serving a tiny checkpoint whose vocabulary holds Qwen2.5-Coder's FIM tokens.
    from engine.runtime import Engine

    engine = Engine(load_tiny_llm(build_tiny_llm(tmp_path, extra_special_tokens=QWEN_FIM)), max_iteration_tokens=8)
    body = {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4, "temperature": 0}
    with _client(engine) as client:
        answer = client.post("/v1/completions", json=body)
        tokens = client.post("/tokenize", json={"prompt": "<|fim_prefix|>" + PREFIX + "<|fim_suffix|>" + SUFFIX
                                                          + "<|fim_middle|>"}).json()["tokens"]
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert isinstance(choice["text"], str) and choice["finish_reason"] in ("stop", "length")
    assert answer.json()["usage"]["prompt_tokens"] == len(tokens)


def test_a_model_without_fim_tokens_refuses_a_suffix_by_name(tiny_loaded: Any) -> None:
    # The demo's case (SmolLM2 has no FIM tokens): a 400 naming suffix, never a reply that ignores it.
    from engine.runtime import Engine

    with _client(Engine(tiny_loaded, max_iteration_tokens=8)) as client:
        refused = client.post("/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX})
        plain = client.post("/v1/completions", json={"prompt": PREFIX, "suffix": "", "max_tokens": 2})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "suffix" and "no fill-in-the-middle tokens" in error["message"], error
    assert plain.status_code == 200, plain.text


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": PREFIX, "suffix": SUFFIX, "echo": True}, "echo", "echo is not supported with a suffix"),
    ({"prompt": [1, 2, 3], "suffix": SUFFIX}, "suffix", "text prompts only"),
    ({"prompt": [[1, 2], [3]], "suffix": SUFFIX}, "suffix", "text prompts only"),
])
def test_echo_and_token_prompts_with_a_suffix_are_refused_by_name(fim_engine: FakeEngine, body: dict[str, Any],
                                                                   param: str, words: str) -> None:
    # Token ids are the model's own input already (a client with them writes the FIM tokens itself); an echo would
    # put the prompt before a reply that is no continuation of it.
    with _client(fim_engine) as client:
        answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
    assert words in answer.json()["error"]["message"]
    assert fim_engine.requests == []
