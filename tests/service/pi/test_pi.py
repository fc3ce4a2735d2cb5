"""service/pi/: the provider definition route, models.json merging, compaction fit, `tandem pi`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.datastructures import State
from litestar.testing import TestClient

from service.pi import agent_files, command
from service.pi.route import pi_provider
from service.state import AppState
from tests.service.fake_engine import FakeEngine


class _ThinkingTokenizer:
    has_thinking = True
    chat_template = "{% if enable_thinking %}<think>{% endif %}"


def _client(engine: Any) -> TestClient:
    state = AppState(engine=engine)
    return TestClient(Litestar(route_handlers=[pi_provider], state=State({"tandem": state})))


def test_provider_route_describes_the_served_model():
    with _client(FakeEngine(context_length=8192)) as client:
        response = client.get("/v1/pi/provider")
    assert response.status_code == 200
    entry = response.json()["providers"]["mlx-tandem"]
    assert entry["api"] == "openai-completions"
    assert entry["baseUrl"] == "http://testserver.local/v1"
    assert entry["compat"]["supportsDeveloperRole"] is True
    assert entry["compat"]["sendSessionAffinityHeaders"] is True
    assert "thinkingFormat" not in entry["compat"]
    (model,) = entry["models"]
    assert (model["id"], model["contextWindow"], model["reasoning"]) == ("fake-model", 8192, False)
    assert 0 < model["maxTokens"] <= 8192


def test_provider_route_gives_pi_the_context_the_memory_budget_holds():
    # `tandem pi` wrote contextWindow 8192 while --memory-budget let a request hold 1,279 tokens.
    engine = FakeEngine(context_length=8192)
    engine.budget_fits = 1279
    with _client(engine) as client:
        (model,) = client.get("/v1/pi/provider").json()["providers"]["mlx-tandem"]["models"]
    assert model["contextWindow"] == 1279 and model["maxTokens"] <= 1279


def test_a_server_without_the_provider_route_is_read_by_its_max_model_len(monkeypatch: pytest.MonkeyPatch):
    # vLLM's /v1/models gives max_model_len only: the entry said 4,096 whatever the server held.
    def get_json(url: str, **_: Any) -> tuple[int, Any]:
        if url.endswith("/v1/models"):
            return 200, {"data": [{"id": "served", "max_model_len": 32768}]}
        return 404, {}

    monkeypatch.setattr(command, "_get_json", get_json)
    entry = command._provider_from_server("http://127.0.0.1:1")
    assert entry["models"][0]["contextWindow"] == 32768


def test_provider_route_sets_thinking_format_for_a_thinking_switch():
    engine = FakeEngine(context_length=40960)
    engine.tokenizer = _ThinkingTokenizer()  # type: ignore[assignment]
    with _client(engine) as client:
        entry = client.get("/v1/pi/provider").json()["providers"]["mlx-tandem"]
    assert entry["compat"]["thinkingFormat"] == "qwen-chat-template"
    assert entry["models"][0]["reasoning"] is True


def test_provider_route_without_chat_model_lists_no_models():
    with _client(None) as client:
        assert client.get("/v1/pi/provider").json()["providers"]["mlx-tandem"]["models"] == []


def test_merge_keeps_other_providers_and_keys(tmp_path: Path):
    (tmp_path / "models.json").write_text(json.dumps({"providers": {"ollama": {"baseUrl": "x"}}, "other": 1}))
    agent_files.merge_provider(tmp_path, "mlx-tandem", {"baseUrl": "y"})
    agent_files.merge_provider(tmp_path, "mlx-tandem", {"baseUrl": "z"})
    data = json.loads((tmp_path / "models.json").read_text())
    assert data == {"providers": {"ollama": {"baseUrl": "x"}, "mlx-tandem": {"baseUrl": "z"}}, "other": 1}


def test_merge_creates_the_agent_dir(tmp_path: Path):
    path = agent_files.merge_provider(tmp_path / "new" / "agent", "mlx-tandem", {"baseUrl": "y"})
    assert json.loads(path.read_text()) == {"providers": {"mlx-tandem": {"baseUrl": "y"}}}


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"providers": 3}'])
def test_merge_never_clobbers_a_file_it_cannot_read(tmp_path: Path, content: str):
    (tmp_path / "models.json").write_text(content)
    with pytest.raises(ValueError):
        agent_files.merge_provider(tmp_path, "mlx-tandem", {})
    assert (tmp_path / "models.json").read_text() == content


def test_compaction_reserve_fits_a_small_window(tmp_path: Path):
    (tmp_path / "settings.json").write_text(json.dumps({"theme": "dark"}))
    assert agent_files.fit_compaction(tmp_path, 8192) == {"reserveTokens": 2048, "keepRecentTokens": 2048}
    data = json.loads((tmp_path / "settings.json").read_text())
    assert data == {"theme": "dark", "compaction": {"reserveTokens": 2048, "keepRecentTokens": 2048}}


def test_compaction_keeps_the_users_choice_and_large_windows(tmp_path: Path):
    (tmp_path / "settings.json").write_text(json.dumps({"compaction": {"reserveTokens": 4000}}))
    assert agent_files.fit_compaction(tmp_path, 8192) is None
    assert agent_files.fit_compaction(tmp_path / "other", 131072) is None
    assert not (tmp_path / "other" / "settings.json").exists()


def test_agent_dir_follows_pi():
    assert agent_files.agent_dir({"PI_CODING_AGENT_DIR": "/x/y"}) == Path("/x/y")
    assert agent_files.agent_dir({}) == Path.home() / ".pi" / "agent"


def test_missing_pi_says_how_to_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    env = {"PATH": str(tmp_path), "PI_CODING_AGENT_DIR": str(tmp_path / "agent")}
    assert command.pi_command(["-p", "hi"], environ=env, exec_fn=_never) == 127
    assert command.INSTALL_HINT in capsys.readouterr().err
    assert not (tmp_path / "agent").exists()


def _never(*_: Any) -> None:
    raise AssertionError("pi must not be executed")


# A stand-in server process: answers /health once "loaded" and serves a provider document.
STUB_SERVER = textwrap.dedent(
    """
    import json, sys
    from http.server import HTTPServer, BaseHTTPRequestHandler

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            base = "http://%s/v1" % self.headers["host"]
            docs = {
                "/health": {"status": "ok"},
                "/v1/pi/provider": {"providers": {"mlx-tandem": {"baseUrl": base, "api": "openai-completions",
                    "models": [{"id": "stub-model", "contextWindow": 8192, "maxTokens": 2048}]}}},
            }
            body = json.dumps(docs.get(self.path, {"error": "no"})).encode()
            self.send_response(200 if self.path in docs else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = HTTPServer(("127.0.0.1", 0), H)
    print(server.server_address[1], flush=True)
    server.serve_forever()
    """
)


@pytest.fixture
def stub_server(tmp_path: Path):
    script = tmp_path / "stub_server.py"
    script.write_text(STUB_SERVER)
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield int(process.stdout.readline())
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_pi_command_writes_provider_and_execs_pi(tmp_path: Path, stub_server: int):
    fake_pi = tmp_path / "pi"
    fake_pi.write_text("#!/bin/sh\n")
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "models.json").write_text(json.dumps({"providers": {"mine": {"baseUrl": "keep"}}}))
    calls: list[tuple[str, list[str]]] = []
    env = {"TANDEM_PI_BIN": str(fake_pi), "PI_CODING_AGENT_DIR": str(agent), "PATH": ""}
    code = command.pi_command(["--port", str(stub_server), "-p", "hello"], environ=env,
                         exec_fn=lambda f, a, e: calls.append((f, a)), ready_timeout=30)
    assert code == 0
    assert calls == [(str(fake_pi), [str(fake_pi), "--provider", "mlx-tandem", "--model", "stub-model", "-p", "hello"])]
    providers = json.loads((agent / "models.json").read_text())["providers"]
    assert providers["mine"] == {"baseUrl": "keep"}
    assert providers["mlx-tandem"]["baseUrl"] == f"http://127.0.0.1:{stub_server}/v1"
    assert json.loads((agent / "settings.json").read_text())["compaction"]["reserveTokens"] == 2048


def test_pi_command_keeps_an_explicit_model_choice(tmp_path: Path, stub_server: int):
    fake_pi = tmp_path / "pi"
    fake_pi.write_text("#!/bin/sh\n")
    calls: list[list[str]] = []
    env = {"TANDEM_PI_BIN": str(fake_pi), "PI_CODING_AGENT_DIR": str(tmp_path / "agent")}
    command.pi_command(["--port", str(stub_server), "--", "--model", "other/x"], environ=env,
                  exec_fn=lambda f, a, e: calls.append(a), ready_timeout=30)
    assert calls == [[str(fake_pi), "--model", "other/x"]]


def test_bad_arguments_are_reported(capsys: pytest.CaptureFixture[str]):
    assert command.pi_command(["--port"], environ={}, exec_fn=_never) == 2
    assert command.pi_command(["--port", "abc"], environ={}, exec_fn=_never) == 2


def test_options_take_their_value_after_an_equals_sign_too():
    # `--port=N` was passed on to pi: a second server started on the default port and pi refused the option.
    ours, rest = command.split_args(["--port=9", "--api-key=k=v", "--host=::1", "--serve-model=m", "-p", "--port=1"])
    assert ours == {"port": "9", "api-key": "k=v", "host": "::1", "serve-model": "m"}
    assert rest == ["-p", "--port=1"]


def test_a_bad_port_after_an_equals_sign_is_reported(capsys: pytest.CaptureFixture[str]):
    assert command.pi_command(["--port=abc"], environ={}, exec_fn=_never) == 2
    assert "--port must be a number" in capsys.readouterr().err


def _fake_pi(tmp_path: Path) -> dict[str, str]:
    fake_pi = tmp_path / "pi"
    fake_pi.write_text("#!/bin/sh\n")
    return {"TANDEM_PI_BIN": str(fake_pi), "PI_CODING_AGENT_DIR": str(tmp_path / "agent"), "PATH": ""}


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_an_ipv6_host_is_bracketed_in_the_servers_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str):
    urls: list[str] = []
    doc = {"providers": {"mlx-tandem": {"baseUrl": "x", "models": [{"id": "m", "contextWindow": 65536}]}}}

    def get_json(url: str, timeout: float = 2.0, key: str | None = None) -> tuple[int, Any]:
        urls.append(url)
        return 200, doc

    monkeypatch.setattr(command, "_get_json", get_json)
    assert command.pi_command(["--host", host, "--port", "9"], environ=_fake_pi(tmp_path),
                              exec_fn=lambda *_: None) == 0
    assert urls and all(url.startswith("http://[::1]:9/") for url in urls), urls


def test_a_host_that_makes_no_url_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert command.pi_command(["--host", "no:such:host", "--port", "9"], environ=_fake_pi(tmp_path),
                              exec_fn=_never) == 2
    assert "--host 'no:such:host' gives no valid URL" in capsys.readouterr().err


def test_a_missing_tandem_pi_bin_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    env = {"TANDEM_PI_BIN": str(tmp_path / "nowhere" / "pi"), "PATH": ""}
    assert command.pi_command(["-p", "hi"], environ=env, exec_fn=_never) == 127
    err = capsys.readouterr().err
    assert f"TANDEM_PI_BIN is '{tmp_path / 'nowhere' / 'pi'}'" in err and command.INSTALL_HINT not in err


def test_models_json_is_the_users_alone(tmp_path: Path):
    # It holds the API key: world-readable under the default umask it leaked.
    (tmp_path / "models.json").write_text("{}")
    (tmp_path / "models.json").chmod(0o644)
    (tmp_path / "models.json.tandem-tmp").write_text("left by a crash")
    (tmp_path / "models.json.tandem-tmp").chmod(0o644)
    path = agent_files.merge_provider(tmp_path, "mlx-tandem", {"apiKey": "secret"})
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["providers"]["mlx-tandem"] == {"apiKey": "secret"}


def test_provider_route_lets_pi_set_a_harmony_models_reasoning_effort():
    from tests.service.chat.test_harmony_replies import HarmonyTokenizer

    engine = FakeEngine(context_length=131072)
    engine.tokenizer = HarmonyTokenizer()
    with _client(engine) as client:
        entry = client.get("/v1/pi/provider").json()["providers"]["mlx-tandem"]
    # gpt-oss's template reads reasoning_effort, which pi sends as OpenAI's field (its default thinking format)
    assert entry["compat"]["supportsReasoningEffort"] is True and "thinkingFormat" not in entry["compat"]
    (model,) = entry["models"]
    assert model["reasoning"] is True
    assert model["thinkingLevelMap"]["xhigh"] == "high" and model["thinkingLevelMap"]["minimal"] == "low"
