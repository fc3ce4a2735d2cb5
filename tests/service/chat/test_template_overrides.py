"""mlx_lm.server's --chat-template and --chat-template-args: a template that replaces the checkpoint's (a base
model gets one), and template variables every request gets unless it sets them (Qwen3 users switch thinking off
server-wide). Both were "unrecognized arguments"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.cli.main import build_parser, main
from service.cli.serve import serve_config
from service.config import ServiceConfig
from service.state import AppState
from tests.fixtures.tiny_llm import CHATML_TEMPLATE, build_tiny_llm
from tests.service.fake_engine import FakeEngine


def test_the_flags_reach_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML_TEMPLATE)
    parse = build_parser().parse_args
    config = serve_config(parse(["serve", "--chat-template", str(template),
                                 "--chat-template-args", '{"enable_thinking": false}']))
    assert config.chat_template == CHATML_TEMPLATE and config.chat_template_args == {"enable_thinking": False}
    assert serve_config(parse(["serve", "--chat-template", "{{ messages }}"])).chat_template == "{{ messages }}"
    assert ServiceConfig.from_env({"TANDEM_SERVE_CONFIG": config.to_json()}).chat_template_args == {
        "enable_thinking": False}  # what the worker and an --isolate child read
    for args, words in ([["--chat-template-args", "[1]"], "JSON object"], [["--chat-template-args", "{"], "not JSON"],
                        [["--chat-template-args", '{"tools": 1}'], "not a template variable"],
                        [["--chat-template", " "], "is empty"]):
        assert main(["serve", *args]) == 2
        assert words in capsys.readouterr().err


def test_server_template_args_are_defaults_a_request_overrides() -> None:
    engine = FakeEngine(["ok"], context_length=4096)
    state = AppState(engine=engine, config=ServiceConfig(chat_template_args={"enable_thinking": False, "x": 1}))
    with TestClient(create_app(state)) as client:
        user = [{"role": "user", "content": "hi"}]
        assert client.post("/v1/chat/completions", json={"messages": user}).status_code == 200
        assert engine.tokenizer.template_calls[-1]["enable_thinking"] is False
        body = {"messages": user, "chat_template_kwargs": {"enable_thinking": True}}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        call = engine.tokenizer.template_calls[-1]
        assert call["enable_thinking"] is True and call["x"] == 1


@pytest.mark.anyio
async def test_a_replaced_template_is_the_models_own(tmp_path: Path) -> None:
    from service.engines import open_engine

    path = build_tiny_llm(tmp_path / "base")
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    engine: Any = await open_engine(ServiceConfig(model=str(path), chat_template=CHATML_TEMPLATE))
    try:
        text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                    add_generation_prompt=True)
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    finally:
        engine.close()
