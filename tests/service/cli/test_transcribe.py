"""service/transcribe_cli.py: `tandem transcribe`, `tandem models import`, and serve's speech options."""

from __future__ import annotations

import argparse
import io
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from service.cli.main import build_parser, main
from service.config import ServiceConfig
from service.speech.setup import speech_config
from service.cli.serve_speech import configure_serve_speech
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.cli.conftest import write_wav


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wav(tmp_path_factory.mktemp("audio") / "noise.wav", np.random.default_rng(0).normal(0, 0.1, 16000 * 2))


def test_transcribe_prints_the_format_and_verbose_speed(whisper_dir: Path, wav: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["transcribe", str(wav), str(whisper_dir), "--format", "verbose_json", "--verbose",
                 "--no-fallback", "--temperature", "1.0", "--no-timestamps"])
    out, err = capsys.readouterr()
    assert code == 0
    body = json.loads(out)
    assert body["duration"] == pytest.approx(2.0) and body["task"] == "transcribe"
    assert "s audio in" in err and "realtime" in err


def test_translate_on_an_english_only_model_is_its_transcription_as_on_the_server(
        whisper_dir: Path, wav: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It exited 2 ("task 'translate' is not available") while /v1/audio/translations answers the transcription."""
    common = [str(wav), str(whisper_dir), "--format", "verbose_json", "--no-fallback", "--temperature", "0"]
    assert main(["transcribe", *common]) == 0
    transcribed = json.loads(capsys.readouterr().out)
    assert main(["transcribe", *common, "--task", "translate"]) == 0
    out, err = capsys.readouterr()
    translated = json.loads(out)
    assert translated["text"] == transcribed["text"] and translated["segments"] == transcribed["segments"]
    assert len(err.strip().splitlines()) == 1 and "English-only" in err and "transcription" in err


@pytest.mark.parametrize("argv, message", [
    (["transcribe", "/no/such.wav"], "no such audio file"),
    (["transcribe", "{wav}", "{model}", "--language", "de"], "English-only"),
    (["transcribe", "{wav}", "/no/model/here"], "not found"),
    (["models", "import", "/no/ct2", "/tmp/out"], "model.bin"),
])
def test_cli_errors_are_one_line(argv: list[str], message: str, whisper_dir: Path, wav: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(wav=wav, model=whisper_dir) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_file_too_short_to_transcribe_is_an_error_as_on_the_server(whisper_dir: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    short = write_wav(tmp_path / "short.wav", np.full(800, 0.1))  # 0.05 s
    assert main(["transcribe", str(short), str(whisper_dir)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "at least 0.1 s" in err and len(err.strip().splitlines()) == 1


def _serve_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_serve_positional_whisper_model_is_transcription_only(whisper_dir: Path) -> None:
    config = ServiceConfig(model=str(whisper_dir))
    assert configure_serve_speech(_serve_args(str(whisper_dir), "--whisper-resident"), config).transcription_only
    speech = speech_config(config)
    assert config.model is None and speech is not None
    assert speech.transcription_only and speech.resident and speech.model == str(whisper_dir)


def test_serve_demo_is_the_chat_demo_and_a_whisper_model_with_no_whisper_is_refused(whisper_dir: Path) -> None:
    # "demo" names both demos; `serve demo --no-whisper` served Whisper alone (chat 404, --no-whisper dropped).
    from service.cli.errors import CLIError

    config = ServiceConfig(model="demo")
    assert not configure_serve_speech(_serve_args("demo", "--no-whisper"), config).transcription_only
    assert config.model == "demo" and speech_config(config) is None
    with pytest.raises(CLIError, match="is a Whisper model, and with speech off nothing would be served"):
        configure_serve_speech(_serve_args(str(whisper_dir), "--no-whisper"), ServiceConfig(model=str(whisper_dir)))


def test_serve_whisper_model_beside_a_chat_model(whisper_dir: Path, tmp_path: Path) -> None:
    config = ServiceConfig(model="some-chat-model")
    args = _serve_args("some-chat-model", "--whisper-model", str(whisper_dir), "--whisper-idle-unload", "30")
    assert not configure_serve_speech(args, config).transcription_only
    speech = speech_config(config)
    assert config.model == "some-chat-model" and speech is not None and speech.idle_unload_sec == 30


def test_serve_with_a_bad_whisper_model_fails_clearly(tmp_path: Path) -> None:
    from service.cli.errors import CLIError

    with pytest.raises(CLIError, match="--whisper-model"):
        configure_serve_speech(_serve_args("--whisper-model", str(tmp_path)), ServiceConfig())
    assert not configure_serve_speech(_serve_args("--no-whisper"), ServiceConfig()).transcription_only


def test_an_empty_file_is_called_empty_not_undecodable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # FFmpeg's answer was "[Errno 1094995529] Invalid data found when processing input"; the server says "empty".
    empty = tmp_path / "zero.wav"
    empty.write_bytes(b"")
    assert main(["transcribe", str(empty)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{empty}: the file is empty" in err and "decode" not in err
    assert len(err.strip().splitlines()) == 1


def _verbose(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    code = main([*argv, "--format", "verbose_json", "--no-fallback", "--temperature", "1.0", "--no-timestamps",
                 "--no-vad"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_a_dash_reads_the_audio_from_stdin(whisper_dir: Path, wav: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # as `tandem generate -` reads its prompt; once "no such audio file: -"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(wav.read_bytes())))
    assert _verbose(["transcribe", "-", str(whisper_dir)], capsys)["duration"] == pytest.approx(2.0)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["transcribe", "-", str(whisper_dir)]) == 2
    err = capsys.readouterr().err
    assert "stdin is empty" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"not audio at all" * 10)))
    assert main(["transcribe", "-", str(whisper_dir)]) == 2
    assert capsys.readouterr().err.startswith("tandem: stdin: could not decode the audio file")


def test_a_pipe_is_transcribed_as_a_file_is(whisper_dir: Path, wav: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # what a shell's <(cat talk.wav) or /dev/stdin names: not a regular file, once refused as "no such audio file"
    fifo = tmp_path / "talk.pipe"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(wav.read_bytes())

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert _verbose(["transcribe", str(fifo), str(whisper_dir)], capsys)["duration"] == pytest.approx(2.0)
    finally:
        if writer.is_alive():  # refused before reading: let the writer finish
            with open(fifo, "rb") as f:
                f.read()
        writer.join()


def test_verbose_json_writes_a_nan_as_null_as_the_server_does(whisper_dir: Path, wav: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import audio.formats

    real = audio.formats.render

    def render(*args: object, **kwargs: object) -> object:
        body = real(*args, **kwargs)  # type: ignore[arg-type]
        assert isinstance(body, dict)
        return {**body, "avg_logprob": float("nan")}  # where the timestamp rules masked every token

    monkeypatch.setattr(audio.formats, "render", render)
    assert main(["transcribe", str(wav), str(whisper_dir), "--format", "verbose_json"]) == 0

    def strict(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    body = json.loads(capsys.readouterr().out, parse_constant=strict)
    assert body["avg_logprob"] is None
