"""`tandem` subcommands, run in-process through main()."""

from __future__ import annotations

from pathlib import Path

import pytest

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
