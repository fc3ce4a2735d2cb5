"""`tandem serve` arguments: an empty key, a queue bound of 0, the help's
defaults, the address at any log level, a bad --host reported alone, and speech flags beside --no-whisper."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from service.cli.main import main


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """service.server.serve returns at once: a check that fails to refuse does not start a real server."""
    import service.server

    monkeypatch.setattr(service.server, "serve", lambda config: 0)


@pytest.mark.parametrize("key", ["", " ", ","])
def test_an_empty_api_key_is_refused(key: str, tiny_llm_dir: Path, no_server: None,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()), "--api-key", key]) == 2
    assert "--api-key is empty" in capsys.readouterr().err


def test_a_queue_bound_of_zero_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import build_parser
    from service.cli.serve import serve_config

    # the engine serves a free row at once (e8cd0d8), so 0 means "none wait", not "refuse everything"
    assert serve_config(build_parser().parse_args(["serve", "--max-queued", "0"])).queue_limit == 0
    assert main(["serve", "--max-queued", "-1"]) == 2
    assert "--max-queued must be >= 0" in capsys.readouterr().err


def test_mlx_lm_servers_spellings_and_no_abbreviations(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import build_parser
    from service.cli.serve import serve_config

    parse = build_parser().parse_args
    # `--model DIR` and `--max-tokens N`, as mlx_lm.server takes them
    config = serve_config(parse(["serve", "--model", "some/dir", "--max-tokens", "512"]))
    assert config.model == "some/dir" and config.max_tokens_cap == 512
    assert main(["serve", "a/dir", "--model", "b/dir"]) == 2
    assert "two chat models given" in capsys.readouterr().err
    assert parse(["serve", "--log-level", "DEBUG"]).log_level == "debug"  # mlx-lm's spelling
    # a prefix of another flag was taken for it: `--prompt 5` set --prompt-cache-bytes
    with pytest.raises(SystemExit):
        parse(["serve", "--prompt", "5"])
    assert "unrecognized arguments: --prompt" in capsys.readouterr().err


def test_the_help_states_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    for flag in ("--prefill-stall X", "--decode-burst N"):
        entry = text.split(flag, 2)[2].split(" --", 1)[0]  # the option's entry (its first mention is the usage)
        assert entry.count("default") == 1, entry


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_address_prints_at_any_log_level(tiny_llm_dir: Path, no_server: None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(port), "--log-level", "warning"]) == 0
    assert f"http://127.0.0.1:{port}/v1" in capsys.readouterr().err


def test_a_bad_host_is_the_one_line_printed(tiny_llm_dir: Path, no_server: None, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TANDEM_API_KEY", raising=False)

    def unresolvable(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--host", "bogus.invalid"]) == 2
    err = capsys.readouterr().err
    assert "cannot resolve --host" in err and "without an API key" not in err, err


# Every flag that changes speech only, with a value other than its default.
_SPEECH_ONLY = [
    ["--whisper-model", "tiny.en"], ["--whisper-idle-unload", "30"], ["--whisper-resident"], ["--preload"],
    ["--session-ttl", "5"], ["--no-vad"], ["--max-sessions", "3"], ["--key-session-share", "0.25"],
    ["--max-session-seconds", "60"], ["--max-buffered-audio", "60"], ["--max-session-lag", "30"],
    ["--whisper-step-positions", "100"], ["--whisper-step-tokens", "2"], ["--whisper-chat-share", "0.5"],
    ["--whisper-catch-up", "2"], ["--live-context", "whole"], ["--whisper-min-step-ms", "3"],
    ["--max-upload-bytes", "1MiB"], ["--max-part-bytes", "1MiB"], ["--max-audio-seconds", "60"],
    ["--max-pcm-chunk-bytes", "64KiB"], ["--max-ws-frame-bytes", "1MiB"],
]


@pytest.mark.parametrize("flag", _SPEECH_ONLY, ids=lambda flag: flag[0])
def test_a_speech_flag_beside_no_whisper_is_refused_by_name(flag: list[str], tiny_llm_dir: Path, no_server: None,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Only --whisper-model, --preload and --whisper-resident were refused; the others were dropped unseen.
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", *flag, "--port", str(_free_port())]) == 2
    err = capsys.readouterr().err
    assert err == f"tandem: --no-whisper serves no Whisper model: {flag[0]} cannot apply\n", err


def test_every_speech_flag_is_covered() -> None:
    from service.cli.main import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    group = next(g for g in serve._action_groups if g.title == "speech")
    flags = {a.option_strings[-1] for a in group._group_actions} - {"--no-whisper"}
    assert flags <= {flag[0] for flag in _SPEECH_ONLY}


def test_speech_flags_at_their_defaults_pass_beside_no_whisper(tiny_llm_dir: Path, no_server: None) -> None:
    # Nothing is dropped when the value given is the one speech-off would have anyway.
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--session-ttl", "300", "--live-context", "auto",
                 "--max-body-bytes", "1MiB", "--port", str(_free_port())]) == 0


def test_an_adapter_path_is_checked_before_the_model_loads(tiny_llm_dir: Path, tmp_path: Path, no_server: None,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # mlx_lm.server's `--adapter-path`: a folder without the trainer's files is one line, and the path travels
    # absolute (an --isolate child may start elsewhere).
    from service.cli.main import build_parser
    from service.cli.serve import serve_config
    from tests.fixtures.tiny_adapter import build_tiny_adapter

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()),
                 "--adapter-path", str(empty)]) == 2
    assert "--adapter-path: adapter path" in capsys.readouterr().err
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()), "--adapter-path="]) == 2
    assert "--adapter-path is empty" in capsys.readouterr().err  # it was the current folder's "no adapter_config"
    adapter = build_tiny_adapter(tiny_llm_dir, tmp_path / "lora")
    monkeypatch.chdir(tmp_path)
    config = serve_config(build_parser().parse_args(["serve", str(tiny_llm_dir), "--adapter-path", "lora"]))
    assert config.adapter_path == str(adapter.resolve())


def test_allowed_origins_are_taken_as_browsers_send_them(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import build_parser
    from service.cli.serve import serve_config

    parse = build_parser().parse_args
    config = serve_config(parse(["serve", "--allowed-origins", "http://localhost:3000/,https://ui.example",
                                 "--allowed-origins", "*", "--allowed-origins", "null"]))
    assert config.allowed_origins == ["http://localhost:3000", "https://ui.example", "*", "null"]
    assert main(["serve", "--allowed-origins", "http://localhost:3000/app"]) == 2
    assert "is not an origin" in capsys.readouterr().err
    assert main(["serve", "--allowed-origins", "localhost:3000"]) == 2


def test_sse_keepalive_reaches_the_worker_config(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import build_parser
    from service.cli.serve import serve_config
    from service.config import CONFIG_ENV, ServiceConfig

    parse = build_parser().parse_args
    assert serve_config(parse(["serve"])).sse_keepalive == 2.0  # on by default: short read timeouts need it
    off = serve_config(parse(["serve", "--sse-keepalive", "0"]))  # llmperf reads every line as JSON
    assert ServiceConfig.from_env({CONFIG_ENV: off.to_json()}).sse_keepalive == 0
    with pytest.raises(SystemExit):
        parse(["serve", "--sse-keepalive", "-1"])
    assert "--sse-keepalive" in capsys.readouterr().err
    # 0.001 s was taken: a tool reply's stream was 2,132 keep-alives to 41 tokens (~1 MB of Responses events)
    with pytest.raises(SystemExit):
        parse(["serve", "--sse-keepalive", "0.001"])
    assert "at least 0.5" in capsys.readouterr().err
    assert serve_config(parse(["serve", "--sse-keepalive", "0.5"])).sse_keepalive == 0.5


def test_forwarded_allow_ips_are_taken_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import build_parser
    from service.cli.serve import serve_config

    parse = build_parser().parse_args
    assert serve_config(parse(["serve"])).forwarded_allow_ips == ["127.0.0.1"]  # uvicorn's default
    config = serve_config(parse(["serve", "--forwarded-allow-ips", "127.0.0.1, 10.0.0.0/8", "--forwarded-allow-ips",
                                 "::1"]))
    assert config.forwarded_allow_ips == ["127.0.0.1", "10.0.0.0/8", "::1"]
    assert serve_config(parse(["serve", "--forwarded-allow-ips", "*"])).forwarded_allow_ips == ["*"]
    assert main(["serve", "--forwarded-allow-ips", "proxy.internal"]) == 2
    assert "--forwarded-allow-ips: 'proxy.internal' is not an IP address or network" in capsys.readouterr().err


def test_an_empty_chat_template_is_named_not_read_as_this_folder(tiny_llm_dir: Path, no_server: None,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # --chat-template= was "cannot read .: Is a directory"
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()), "--chat-template="]) == 2
    err = capsys.readouterr().err
    assert "--chat-template is empty" in err and "directory" not in err


def test_a_chat_template_that_is_neither_a_file_nor_jinja_is_refused(tiny_llm_dir: Path, no_server: None,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # A mistyped path was taken as the template itself: every request rendered the path's own text as its prompt.
    port = str(_free_port())
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", port, "--chat-template",
                 "/etc/tandem/my-template.jinja"]) == 2
    assert "--chat-template: no such file '/etc/tandem/my-template.jinja'" in capsys.readouterr().err
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", port, "--chat-template",
                 "{% for m in messages %}{{ m.content }}{% endfor %}"]) == 0  # a template as text still is one


@pytest.mark.parametrize("value", [" , ", ","])
def test_an_api_key_variable_with_no_key_is_refused(value: str, tiny_llm_dir: Path, no_server: None,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # TANDEM_API_KEY=" , " served with no key and no word; --api-key " , " was refused.
    monkeypatch.setenv("TANDEM_API_KEY", value)
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port())]) == 2
    assert "TANDEM_API_KEY holds no key" in capsys.readouterr().err
