"""service/cli/dictate_client.py: the server URL, PCM chunks, and the live display — committed text written
once, the tentative guess rewritten in place on a terminal and left out of a pipe; `tandem dictate`'s arguments,
its summary, and microphone takes each in a session of its own."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.cli.dictate_client import FINAL_COMMIT, LiveLine, pcm16_chunks, realtime_url
from service.cli.main import main
from tests.service.cli.conftest import write_wav
from tests.service.cli.test_dictate_errors import _Server


@pytest.mark.parametrize("server, url", [
    ("http://127.0.0.1:8080", "ws://127.0.0.1:8080/v1/realtime?intent=transcription"),
    ("https://example.org/v1/", "wss://example.org/v1/realtime?intent=transcription"),
    ("ws://h:1", "ws://h:1/v1/realtime?intent=transcription"),
])
def test_the_realtime_url_of_a_server(server: str, url: str) -> None:
    assert realtime_url(server) == url


def test_a_url_that_is_not_a_server_is_refused() -> None:
    with pytest.raises(ValueError):
        realtime_url("ftp://x")


def test_chunks_are_16_bit_and_cover_the_audio() -> None:
    chunks = pcm16_chunks(np.full(2500, 0.5, np.float32), 24000, 50)
    assert [len(c) for c in chunks] == [2400, 2400, 200]
    assert np.frombuffer(chunks[0], "<i2")[0] == 16383


def test_a_pipe_gets_committed_text_and_line_ends_only() -> None:
    out = io.StringIO()
    line = LiveLine(out, tty=False)
    line.commit(" Hello")
    line.guess(" wor")
    line.commit(" world.")
    line.end_utterance()
    assert out.getvalue() == " Hello world.\n"


def test_a_terminal_sees_the_guess_rewritten_in_place() -> None:
    out = io.StringIO()
    line = LiveLine(out, tty=True, width=40)
    line.commit(" Hello")
    line.guess("wor")
    assert out.getvalue().endswith("\r\x1b[K Hello\x1b[2m wor\x1b[0m")
    line.guess("world is")
    line.commit(" world")  # the guess's committed words are not shown twice, even for a moment
    assert out.getvalue().endswith("\r\x1b[K Hello world\x1b[2m is\x1b[0m")
    line.end_utterance()
    assert out.getvalue().endswith("\r\x1b[K Hello world\n")


@pytest.mark.parametrize("guess, delta, shown", [
    (" Mr. John Dashwood had then", " Mr. John Dashwood had then", ""),  # the probe's line: all of it committed
    (" Mr. John Dashwood had then", " Mr. John", " Dashwood had then"),
    (" Mr. John Dashwood", " Mr. Jo", ""),  # cut mid-word: the rest is no word of its own
    (" Mr. John Dashwood", " Mrs. Dashwood", ""),  # the commit did not follow the guess: stale
])
def test_a_delta_takes_its_words_out_of_the_guess(guess: str, delta: str, shown: str) -> None:
    out = io.StringIO()
    line = LiveLine(out, tty=True, width=200)
    line.commit("And")
    line.guess(guess)
    line.commit(delta)
    dim = f"\x1b[2m {shown.strip()}\x1b[0m" if shown else ""
    assert out.getvalue().endswith("\r\x1b[KAnd" + delta + dim)


def test_a_wrapped_line_shows_no_stale_guess() -> None:
    out = io.StringIO()
    line = LiveLine(out, tty=True, width=20)
    line.commit("And Mr. John")
    line.guess(" Dashwood had then")
    line.commit(" Dashwood had then")  # wraps: "And Mr. John" is printed, the rest stays on the live line
    assert out.getvalue().endswith("\r\x1b[KDashwood had then")


def test_a_long_utterance_wraps_without_rewriting_finished_lines() -> None:
    out = io.StringIO()
    line = LiveLine(out, tty=True, width=20)
    for word in "one two three four five six seven eight".split():
        line.commit(" " + word)
    finished = [p for p in out.getvalue().split("\r\x1b[K") if p.endswith("\n")]
    assert finished and all(len(p) <= 21 for p in finished)
    assert "".join(line.text) == " one two three four five six seven eight"


def test_dictate_refuses_a_bad_speed_and_a_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dictate", "--file", "x.wav", "--speed", "0"]) != 0
    assert main(["dictate", "--file", "/nonexistent.wav"]) != 0
    assert "speed" in capsys.readouterr().err


@pytest.mark.parametrize("speed", ["nan", "inf", "-inf", "-1"])
def test_a_speed_must_be_a_finite_number_over_zero(speed: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dictate", "--file", "x.wav", f"--speed={speed}"]) == 2
    err = capsys.readouterr().err
    assert "--speed must be a finite number > 0" in err and len(err.strip().splitlines()) == 1


def _answering(transcripts: list[str]) -> Any:
    """A Realtime server whose take's commit completes one item per transcript."""
    async def handler(ws: Any) -> None:
        await ws.recv()  # session.update
        await ws.send(json.dumps({"type": "session.updated", "session": {}}))
        async for message in ws:
            if json.loads(message).get("type") != "input_audio_buffer.commit":
                continue
            for i, text in enumerate(transcripts):
                await ws.send(json.dumps({"type": "input_audio_buffer.committed", "item_id": f"item_{i}",
                                          "client_event_id": FINAL_COMMIT if i == len(transcripts) - 1 else None}))
                await ws.send(json.dumps({"type": "conversation.item.input_audio_transcription.completed",
                                          "item_id": f"item_{i}", "transcript": text}))
    return handler


@pytest.mark.parametrize("transcripts, summary", [([""], "; 0 utterances"), (["Hello.", ""], "; 1 utterance\n"),
                                                  (["Hello.", "Again."], "; 2 utterances")])
def test_the_summary_counts_the_utterances_with_text(transcripts: list[str], summary: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    wav = write_wav(tmp_path / "silence.wav", np.zeros(1600))
    with _Server(_answering(transcripts)) as server:
        assert main(["dictate", str(wav), "--server", server, "--speed", "50"]) == 0
    assert summary in capsys.readouterr().err


def test_without_a_microphone_dictate_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import builtins

    real_import = builtins.__import__

    def no_sounddevice(name: str, *args: object, **kwargs: object) -> object:
        if name == "sounddevice":
            raise ImportError("no module named sounddevice")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_sounddevice)
    assert main(["dictate"]) != 0
    err = capsys.readouterr().err
    # Both ways to install it: pip's extra, and in a clone uv's (a bare `uv sync --extra mic` drops the others).
    assert "pip install 'mlx-tandem[mic]'" in err and "`uv sync` with the extras you use plus `--extra mic`" in err


def test_a_file_after_the_vocabulary_is_named_as_read_for_a_word(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # `--vocabulary A B FILE`: nargs="+" took FILE as a word, and the error was the microphone's.
    wav = write_wav(tmp_path / "talk.wav", np.zeros(1600))
    assert main(["dictate", "--vocabulary", "Tandem", "MLX", str(wav)]) == 2
    err = capsys.readouterr().err
    assert err == (f"tandem: {wav} was read as a vocabulary word: put it before --vocabulary or pass --file {wav}\n")


@pytest.mark.anyio
async def test_an_error_repeated_for_every_append_is_written_once() -> None:
    # A draining server refuses each append after it: dictate wrote one line per 100 ms chunk.
    from service.cli.dictate_client import DictateSession

    log = io.StringIO()
    session = DictateSession(ws=None, display=LiveLine(io.StringIO(), tty=False), log=log)
    session._updated.set()  # configured
    draining = json.dumps({"type": "error", "error": {"code": "shutting_down", "message": "Shutting down."}})
    other = json.dumps({"type": "error", "error": {"code": "invalid_value", "message": "Bad."}})

    async def messages() -> Any:
        for raw in (draining, draining, draining, other, draining):
            yield raw

    await session.receive(messages())
    assert log.getvalue().count("shutting_down") == 2 and log.getvalue().count("invalid_value") == 1
    assert len(session.errors) == 5


class _Microphone:
    """sounddevice as `_takes` uses it: a stream that captures one chunk as it opens."""

    class RawInputStream:
        def __init__(self, callback: Any, **kwargs: Any) -> None:
            self.callback = callback

        def __enter__(self) -> None:
            self.callback(b"\x01\x00" * 2400, 2400, None, None)

        def __exit__(self, *exc: object) -> None:
            pass


def test_each_microphone_take_is_a_session_of_its_own(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # One socket left silent between takes held a server place and was closed after the server's --session-ttl.
    from service.cli import dictate

    connections: list[list[str]] = []

    async def handler(ws: Any) -> None:
        seen: list[str] = []
        connections.append(seen)
        async for message in ws:
            kind = json.loads(message)["type"]
            seen.append(kind)
            if kind == "session.update":
                await ws.send(json.dumps({"type": "session.updated", "session": {}}))
            elif kind == "input_audio_buffer.commit":
                await ws.send(json.dumps({"type": "input_audio_buffer.committed", "item_id": "item_0",
                                          "client_event_id": FINAL_COMMIT}))
                await ws.send(json.dumps({"type": "conversation.item.input_audio_transcription.delta",
                                          "item_id": "item_0", "delta": "Hello."}))
                await ws.send(json.dumps({"type": "conversation.item.input_audio_transcription.completed",
                                          "item_id": "item_0", "transcript": "Hello."}))

    monkeypatch.setattr(dictate, "_sounddevice", lambda: _Microphone)
    monkeypatch.setattr("sys.stdin", io.StringIO("\n\n\n\n"))  # two takes (Enter, Enter each), then end of input
    with _Server(handler) as server:
        assert main(["dictate", "--server", server]) == 0
    # the first connection checks the server and the settings; then one per take, closed when it is done
    assert connections[0] == ["session.update"]
    assert connections[1:] == [["session.update", "input_audio_buffer.append", "input_audio_buffer.commit"]] * 2
    assert capsys.readouterr().out.count("Hello.") == 2
