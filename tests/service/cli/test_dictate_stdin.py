"""`tandem dictate -` reads stdin: a WAV as --file reads one, raw 16-bit PCM at --rate sent as it arrives."""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.cli.dictate_client import FINAL_COMMIT
from service.cli.main import main
from tests.service.cli.conftest import write_wav
from tests.service.cli.test_dictate_errors import _Server


class _Stdin:
    """A piped stdin holding `data` (or reading `pipe`)."""

    def __init__(self, data: bytes, tty: bool = False, pipe: Any = None) -> None:
        self.buffer = pipe if pipe is not None else io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class _Recorder:
    """A Realtime server that keeps the session's rate and every byte of audio appended, and ends the take."""

    def __init__(self) -> None:
        self.rates: list[int] = []
        self.audio = b""
        self.heard = threading.Event()  # the first audio arrived

    async def __call__(self, ws: Any) -> None:
        update = json.loads(await ws.recv())
        self.rates.append(update["session"]["audio"]["input"]["format"]["rate"])
        await ws.send(json.dumps({"type": "session.updated", "session": {}}))
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "input_audio_buffer.append":
                self.audio += base64.b64decode(event["audio"])
                self.heard.set()
            elif event["type"] == "input_audio_buffer.commit":
                await ws.send(json.dumps({"type": "input_audio_buffer.committed", "item_id": "item_0",
                                          "client_event_id": FINAL_COMMIT}))
                await ws.send(json.dumps({"type": "conversation.item.input_audio_transcription.completed",
                                          "item_id": "item_0", "transcript": "Hello."}))


def test_raw_pcm16_on_stdin_is_sent_as_it_is_at_the_rate_given(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    raw = (np.sin(np.arange(8001) / 5) * 9000).astype("<i2").tobytes() + b"\x01"  # 1 s at 8 kHz, half a sample
    monkeypatch.setattr(sys, "stdin", _Stdin(raw))
    recorder = _Recorder()
    with _Server(recorder) as server:
        assert main(["dictate", "-", "--rate", "8000", "--server", server, "--speed", "50"]) == 0
    assert recorder.rates == [8000] and recorder.audio == raw[:-1]
    err = capsys.readouterr().err
    assert "1.0 s of audio" in err and "1 utterance" in err and "last byte" in err, err


def test_raw_pcm16_is_sent_before_stdin_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    # a recorder's pipe (arecord -t raw | tandem dictate -) never ends while it records
    reader, writer = os.pipe()
    recorder = _Recorder()
    heard_before_the_end: list[bool] = []

    def record() -> None:
        os.write(writer, b"\1\0" * 16000)
        heard_before_the_end.append(recorder.heard.wait(30))
        os.write(writer, b"\2\0" * 1600)
        os.close(writer)

    pipe = os.fdopen(reader, "rb")
    monkeypatch.setattr(sys, "stdin", _Stdin(b"", pipe=pipe))
    thread = threading.Thread(target=record)
    with pipe, _Server(recorder) as server:
        thread.start()
        assert main(["dictate", "-", "--server", server, "--speed", "50"]) == 0
        thread.join()
    assert heard_before_the_end == [True] and recorder.audio == b"\1\0" * 16000 + b"\2\0" * 1600


def test_a_wav_on_stdin_is_sent_as_the_same_file_given_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    wav = write_wav(tmp_path / "a.wav", np.sin(np.arange(4000) / 7) * 0.3)
    by_name, by_stdin = _Recorder(), _Recorder()
    with _Server(by_name) as server:
        assert main(["dictate", "--file", str(wav), "--server", server, "--speed", "50"]) == 0
    monkeypatch.setattr(sys, "stdin", _Stdin(wav.read_bytes()))
    with _Server(by_stdin) as server:
        assert main(["dictate", "--file", "-", "--server", server, "--speed", "50"]) == 0
    assert by_stdin.rates == by_name.rates == [16000]
    assert by_stdin.audio == by_name.audio and len(by_name.audio) == 8000


@pytest.mark.parametrize("stdin, argv, message", [
    (b"", ["-"], "stdin is empty"),
    (None, ["-"], "which is a terminal"),
    ("wav", ["-", "--rate", "8000"], "the wav on stdin has its own"),
    (b"", ["--file", "x.wav", "--rate", "8000"], "--rate is the rate of raw PCM on stdin"),
])
def test_what_stdin_cannot_give_is_one_line(stdin: Any, argv: list[str], message: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = write_wav(tmp_path / "a.wav", np.zeros(1600)).read_bytes() if stdin == "wav" else stdin or b""
    monkeypatch.setattr(sys, "stdin", _Stdin(data, tty=stdin is None))
    assert main(["dictate", *argv, "--server", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_rate_is_a_rate_a_session_takes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["dictate", "-", "--rate", "4000"])
    assert exit_.value.code == 2 and "argument --rate:" in capsys.readouterr().err
