"""`tandem transcribe` arguments: the names `tandem models ls` shows for imports, a directory given as
the audio file, and --vad-trim without --no-vad."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.cli.main import build_parser, main
from service.cli.serve_speech import configure_serve_speech
from service.config import ServiceConfig
from service.speech.setup import speech_config
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.cli.conftest import write_wav


@pytest.fixture
def imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """A Whisper checkpoint imported into the user cache; returns the name `models ls` lists it under."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    build_tiny_whisper(tmp_path / "cache" / "mlx-tandem" / "whisper" / "0123456789abcdef" / "tiny-float32")
    assert main(["models", "ls"]) == 0
    assert "tiny-float32 (imported)" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # no file of that name here
    return "tiny-float32"


@pytest.fixture
def wav(tmp_path: Path) -> Path:
    return write_wav(tmp_path / "noise.wav", np.random.default_rng(0).normal(0, 0.1, 16000))


def test_transcribe_takes_the_name_models_ls_shows(imported: str, wav: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["transcribe", str(wav), imported, "--no-fallback", "--no-timestamps", "--no-vad"])
    assert code == 0, capsys.readouterr().err


def test_transcribe_takes_the_flag_serve_takes(imported: str, wav: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--whisper-model X` (serve's flag) was "unrecognized arguments".
    code = main(["transcribe", str(wav), "--whisper-model", imported, "--no-fallback", "--no-timestamps", "--no-vad"])
    assert code == 0, capsys.readouterr().err
    assert main(["transcribe", str(wav), "tiny.en", "--whisper-model", imported]) == 2
    assert "two Whisper models given" in capsys.readouterr().err


def test_serve_takes_the_name_models_ls_shows(imported: str) -> None:
    args = build_parser().parse_args(["serve", "--whisper-model", imported])
    config = ServiceConfig()
    configure_serve_speech(args, config)
    speech = speech_config(config)
    assert speech is not None and Path(str(speech.model)).name == imported


def test_a_directory_is_not_called_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["transcribe", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "no such" not in err


def test_vad_trim_needs_no_vad(wav: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["transcribe", str(wav), "--vad-trim"]) == 2
    assert "--vad-trim works with --no-vad only" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["text", "json", "srt", "vtt"])
def test_word_timestamps_need_verbose_json(fmt: str, wav: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # silently dropped once (rc 0, no words): refused by name, as the server's 400 refuses timestamp_granularities
    assert main(["transcribe", str(wav), "--word-timestamps", "--format", fmt]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--word-timestamps" in err and "verbose_json" in err and fmt in err
    assert len(err.strip().splitlines()) == 1


def test_a_closed_stdin_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # `tandem transcribe - <&-`: Python leaves sys.stdin None, and .isatty() was an AttributeError traceback.
    monkeypatch.setattr("sys.stdin", None)
    assert main(["transcribe", "-"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tandem: - reads the audio from stdin, which is closed") and err.count("\n") == 1, err


def test_a_language_the_model_lacks_is_refused_before_decoding(tmp_path: Path, wav: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Cantonese on a 99-language Whisper (vocab 51865): a one-line error, where decoding died in a traceback."""
    from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS

    model = build_tiny_whisper(tmp_path / "ml-v2", {**TINY_WHISPER_DIMS, "n_vocab": 51865})
    assert main(["transcribe", str(wav), str(model), "--language", "yue"]) == 2
    err = capsys.readouterr().err
    assert "99 languages" in err and "cantonese" in err and "Traceback" not in err
