"""A reply starts inside a think block only when the template's generation prompt opens one: a conversation that
mentions `<think>` near its end (a user asking about the tag) leaves the reply as content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from engine.chat_output import opens_reasoning
from service.app import create_app
from service.chat.prompt import generation_prompt
from service.state import AppState
from tests.fixtures.tiny_llm import CHATML_TEMPLATE, build_tiny_llm
from tests.service.fake_engine import FakeEngine, FakeTokenizer

OPENS = CHATML_TEMPLATE.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'")
SWITCH = CHATML_TEMPLATE.replace("'<|im_start|>assistant\n'",
                                 "'<|im_start|>assistant\n' + ('<think>\n' if enable_thinking else '')")
assert OPENS != CHATML_TEMPLATE != SWITCH


@pytest.fixture(scope="module")
def thinking_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint whose vocabulary has <think> and </think> as added tokens (as Qwen3's and R1's do)."""
    from tokenizers import Tokenizer

    path = build_tiny_llm(tmp_path_factory.mktemp("thinking"))
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_special_tokens(["<think>", "</think>"])
    tok.save(str(path / "tokenizer.json"))
    return path


def _tokenizer(path: Path, template: str) -> Any:
    from mlx_lm.tokenizer_utils import load

    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return load(path)


@pytest.mark.parametrize("template, kwargs, opens", [
    (CHATML_TEMPLATE, {}, False),
    (OPENS, {}, True),
    (SWITCH, {"enable_thinking": True}, True),
    (SWITCH, {"enable_thinking": False}, False),
])
def test_the_generation_prompt_is_what_the_template_appends(thinking_dir: Path, template: str,
                                                            kwargs: dict[str, Any], opens: bool) -> None:
    tokenizer = _tokenizer(thinking_dir, template)
    assert tokenizer.think_start == "<think>"
    opening = generation_prompt(tokenizer, kwargs)
    assert opening == "<|im_start|>assistant\n" + ("<think>\n" if opens else "")
    assert opens_reasoning(tokenizer, opening) is opens
    # the conversation's own markers never count
    assert not opens_reasoning(tokenizer, "<|im_start|>assistant\n") and opens_reasoning(tokenizer, "<think>")


class ThinkingTokenizer(FakeTokenizer):
    """The fake tokenizer with think markers and a generation prompt that opens a block when `opens`."""

    def __init__(self, opens: bool) -> None:
        super().__init__()
        self.opens = opens
        self.think_start, self.think_end = "<think>", "</think>"
        self.think_start_tokens, self.think_end_tokens = tuple(self.encode("<think>")), tuple(self.encode("</think>"))

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, *, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        self.template_calls.append({"messages": messages, "tools": tools, **kwargs})
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        if kwargs.get("add_generation_prompt"):  # short, so a user's tag lies within the prompt's last tokens
            text += "<a>" + ("<think>\n" if self.opens else "")
        return self.encode(text) if tokenize else text


def _client(opens: bool, pieces: list[str]) -> Iterator[TestClient[Any]]:
    engine = FakeEngine(pieces, context_length=4096)
    engine.tokenizer = ThinkingTokenizer(opens)
    with TestClient(create_app(AppState(engine=engine))) as client:
        yield client


@pytest.mark.parametrize("stream", [False, True])
def test_a_user_who_writes_the_tag_gets_content(stream: bool) -> None:
    for client in _client(False, ["It opens ", "a block."]):
        body = {"messages": [{"role": "user", "content": "What is <think>?"}], "stream": stream}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        if stream:
            chunks = [json.loads(line[6:]) for line in response.text.splitlines()
                      if line.startswith("data: {")]
            deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
            assert "".join(d.get("content") or "" for d in deltas) == "It opens a block."
            assert not any(d.get("reasoning_content") for d in deltas)
        else:
            message = response.json()["choices"][0]["message"]
            assert message["content"] == "It opens a block." and not message.get("reasoning_content")


def test_a_template_that_opens_the_block_starts_the_reply_in_reasoning() -> None:
    for client in _client(True, ["hmm", "</think>", "Answer."]):
        response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        message = response.json()["choices"][0]["message"]
        assert message["content"] == "Answer." and message["reasoning_content"] == "hmm"
