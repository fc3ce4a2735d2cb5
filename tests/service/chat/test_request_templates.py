"""A model without a chat template (a base model): a request's own template (with --allow-request-templates) is
rendered, and template variables or reasoning_effort, which plain lines cannot take, are refused by name — all
three were silently dropped. apply_chat_template's own arguments are refused as the server's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.chat.render import QUOTED_CHARS
from service.config import ServiceConfig
from service.state import AppState
from tests.fixtures.tiny_llm import CHATML_TEMPLATE, build_tiny_llm
from tests.service.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def base_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine.models import load_tokenizer

    path = build_tiny_llm(Path(tmp_path_factory.mktemp("base")))
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(path)


@pytest.fixture
def served(base_tokenizer: Any) -> Iterator[tuple[TestClient[Any], FakeEngine]]:
    engine = FakeEngine(["ok"], context_length=4096)
    engine.tokenizer = base_tokenizer
    state = AppState(engine=engine, config=ServiceConfig(allow_request_templates=True))
    with TestClient(create_app(state)) as client:
        yield client, engine


def _chat(client: TestClient[Any], **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **body})


def test_a_requests_template_is_rendered(served: tuple[TestClient[Any], FakeEngine], base_tokenizer: Any) -> None:
    client, engine = served
    assert _chat(client).status_code == 200
    assert base_tokenizer.decode(engine.requests[-1].prompt_tokens).endswith("user: hi\nassistant: ")
    response = _chat(client, chat_template_kwargs={"chat_template": CHATML_TEMPLATE})
    assert response.status_code == 200, response.text
    rendered = base_tokenizer.decode(engine.requests[-1].prompt_tokens)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("body, param", [
    ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs.enable_thinking"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"chat_template_kwargs": {"messages": "x"}}, "chat_template_kwargs.messages"),
])
def test_what_plain_lines_cannot_take_is_refused(served: tuple[TestClient[Any], FakeEngine], body: dict[str, Any],
                                                 param: str) -> None:
    client, _ = served
    response = _chat(client, **body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


USERS_ONLY = "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"


@pytest.mark.parametrize("template, messages", [
    # It drops the message to continue: transformers' error then quotes the whole rendered chat.
    (USERS_ONLY, [{"role": "user", "content": "long " * 4000}, {"role": "assistant", "content": "Sure,"}]),
    ("{{ raise_exception('no: ' + messages[0].content) }}", [{"role": "user", "content": "long " * 4000}]),
])
def test_a_template_error_is_quoted_only_in_part(served: tuple[TestClient[Any], FakeEngine], template: str,
                                                  messages: list[dict[str, Any]]) -> None:
    client, engine = served
    response = _chat(client, messages=messages, continue_final_message=messages[-1]["role"] == "assistant",
                     chat_template_kwargs={"chat_template": template})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_messages" and error["param"] == "messages", error
    # The 20,000-character prompt came back whole in the message.
    assert len(error["message"]) < QUOTED_CHARS + 200 and "more characters of the template's error" in error["message"]
    assert not engine.requests
