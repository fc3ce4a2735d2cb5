"""vLLM's tokenizer routes: what lm-eval's `local-completions` looks for before it evaluates (it falls back to
fetching the model's tokenizer from the hub, which a local server's model name is not on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.service.fake_engine import FakeEngine

HI = [{"role": "user", "content": "hi"}]


def test_what_lm_eval_checks_before_it_uses_the_server_s_tokenizer(client: TestClient[Any]) -> None:
    # lm_eval.utils.check_remote_tokenizer_support: an eos_token in /tokenizer_info, a token list from /tokenize.
    info = client.get("/tokenizer_info")
    assert info.status_code == 200 and "eos_token" in info.json()
    answer = client.post("/tokenize", json={"prompt": "test", "add_special_tokens": False})
    assert answer.status_code == 200, answer.text
    assert answer.json()["tokens"] == [ord(c) for c in "test"] and answer.json()["count"] == 4


def test_a_conversation_counts_as_the_chat_request_s_prompt(client: TestClient[Any]) -> None:
    counted = client.post("/tokenize", json={"messages": HI}).json()
    usage = client.post("/v1/chat/completions", json={"messages": HI}).json()["usage"]
    assert counted["count"] == usage["prompt_tokens"] == len(counted["tokens"])


def test_detokenize_gives_the_text_back(client: TestClient[Any]) -> None:
    tokens = client.post("/tokenize", json={"prompt": "héllo"}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": tokens}).json() == {"prompt": "héllo"}


@pytest.mark.parametrize("body, param, words", [
    ({"tokens": [-1]}, "tokens", "outside the vocabulary"),
    ({"tokens": [0x3000]}, "tokens", "outside the vocabulary"),
    ({"tokens": [1], "skip_special_tokens": True}, "skip_special_tokens", "Unrecognized"),
])
def test_bad_detokenize_bodies_are_refused_by_name(client: TestClient[Any], body: dict[str, Any], param: str,
                                                   words: str) -> None:
    answer = client.post("/detokenize", json=body)
    assert answer.status_code == 400 and words in answer.json()["error"]["message"], answer.text
    assert param in (answer.json()["error"]["param"] or answer.json()["error"]["message"])


@pytest.mark.parametrize("body, param, words", [
    ({}, "messages", "either prompt or messages"),
    ({"prompt": "x", "messages": HI}, "messages", "either prompt or messages"),
    ({"prompt": "x", "tools": []}, "tools", "go with messages"),
    ({"prompt": "x", "chat_template_kwargs": {"a": 1}}, "chat_template_kwargs", "go with messages"),
    ({"messages": HI, "add_special_tokens": True}, "add_special_tokens", "special tokens of a conversation"),
    ({"messages": HI, "add_generation_prompt": False}, "add_generation_prompt", "only true"),
    ({"prompt": 5}, "prompt", "prompt"),
])
def test_bad_tokenize_bodies_are_refused_by_name(client: TestClient[Any], body: dict[str, Any], param: str,
                                                 words: str) -> None:
    # A model validator's error named no field: `param: null` beside a message that named one.
    answer = client.post("/tokenize", json=body)
    assert answer.status_code == 400 and words in answer.text, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: ")
    assert "also invalid" not in error["message"]


def test_another_model_is_a_404(client: TestClient[Any]) -> None:
    answer = client.post("/tokenize", json={"prompt": "x", "model": "other"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"


def test_a_key_is_asked_for_as_on_every_model_route() -> None:
    from service.config import ServiceConfig

    with TestClient(create_app(AppState(engine=FakeEngine(), config=ServiceConfig(api_keys=["k"])))) as client:
        assert client.post("/tokenize", json={"prompt": "x"}).status_code == 401
        assert client.post("/tokenize", json={"prompt": "x"}, headers={"authorization": "Bearer k"}).status_code == 200


def test_a_real_tokenizer_s_ids_special_tokens_and_template(tiny_llm_dir: Path) -> None:
    # mlx-lm's wrapper around an HF tokenizer, as the server holds it: BOS as the tokenizer adds it unless asked not
    # to, the vocabulary's own pieces, and the template the chat route renders with.
    from engine.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_llm_dir))
    engine = FakeEngine()
    engine.tokenizer = tokenizer
    with TestClient(create_app(AppState(engine=engine))) as client:
        info = client.get("/tokenizer_info").json()
        plain = client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
        bare = client.post("/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
    assert plain["tokens"] == tokenizer.encode("Hello world")
    assert bare["tokens"] == tokenizer.encode("Hello world", add_special_tokens=False)
    assert plain["token_strs"] == tokenizer._tokenizer.convert_ids_to_tokens(plain["tokens"])
    assert info["eos_token"] == tokenizer._tokenizer.eos_token and info["chat_template"] == tokenizer.chat_template
