"""`tandem benchmark NAME ...` dispatches to the bench module with the remaining options."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from service.cli.benchmark import BENCHMARKS
from service.cli.main import main


def test_benchmark_forwards_options_to_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("bench.chat")
    fake.cli = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.chat", fake)
    assert main(["benchmark", "chat", "--levels", "1,2", "--no-peer"]) == 0
    assert seen == [["--levels", "1,2", "--no-peer"]]


def test_every_benchmark_entry_exists() -> None:
    import importlib

    for module, entry, _ in BENCHMARKS.values():
        assert callable(getattr(importlib.import_module(module), entry))


def test_live_speech_has_a_benchmark_name() -> None:
    assert BENCHMARKS["live"][:2] == ("bench.live_serve", "main")


def test_unknown_benchmark_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["benchmark", "nope"])
    assert exc.value.code == 2


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_benchmarks_help_names_it_as_the_user_typed_it(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["benchmark", name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: tandem benchmark {name} ")


def test_an_unknown_model_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # `tandem benchmark chat --model nosuch` was an engine.errors.ModelNotFound traceback (exit 1).
    assert main(["benchmark", "chat", "--model", "no-such-model-here", "--no-peer"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tandem: no model:") and "no-such-model-here" in err and err.count("\n") == 1, err


def test_an_unknown_whisper_model_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from audio.errors import WhisperCheckpointError

    fake = types.ModuleType("bench.chat")

    def refuse(argv: list[str]) -> int:
        raise WhisperCheckpointError("Whisper model 'nosuch' not found")

    fake.cli = refuse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.chat", fake)
    assert main(["benchmark", "chat"]) == 2
    assert capsys.readouterr().err == "tandem: Whisper model 'nosuch' not found\n"


def test_no_name_asks_for_the_name_only(capsys: pytest.CaptureFixture[str]) -> None:
    # The options after NAME are optional: the usage error said "required: name, options".
    with pytest.raises(SystemExit) as exc:
        main(["benchmark"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "required: name" in err and "options" not in err.splitlines()[-1], err


def test_a_tokenizer_folder_that_is_not_there_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # mlx-lm took the path for a repo id: an HFValidationError traceback.
    missing = tmp_path / "nonexistent"
    assert main(["benchmark", "engine", "--tokenizer", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer {missing}: no such folder" in err and err.count("\n") == 1, err


def test_a_server_that_does_not_answer_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # `benchmark live --server <down>` (its speakers ask /stats first) ended with an httpx.ConnectError traceback.
    import signal

    port = _closed_port()
    handler = signal.getsignal(signal.SIGTERM)  # the benchmark takes SIGTERM over (to stop a server it started)
    try:
        assert main(["benchmark", "live", "--server", f"http://127.0.0.1:{port}", "--itl-sessions", "0",
                     "--speakers", "1", "--seconds", "1"]) == 1
    finally:
        signal.signal(signal.SIGTERM, handler)
    err = capsys.readouterr().err
    assert err.startswith(f"tandem: cannot reach http://127.0.0.1:{port}: ") and err.count("\n") == 1, err


def _closed_port() -> int:
    """A local port nothing listens on (bound, then let go)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
