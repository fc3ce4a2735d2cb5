"""Chat and speech on one loop: a chat stream keeps emitting tokens between Whisper window tasks, and a
deleted session's queued window never runs. Order of events is observed, never time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from audio.pcm import PcmFormat
from audio.decoding import WindowedTranscription
from audio.speech import SpeechService
from engine.contracts import GenerationRequest, SamplingParams
from engine.runtime import Engine
from tests.fixtures.tiny_llm import SPECIAL_TOKENS
from tests.fixtures.tiny_whisper import build_tiny_whisper

pytestmark = pytest.mark.anyio
SR = 16000


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


def no_eos(tiny_loaded: Any) -> SamplingParams:
    ids = tiny_loaded.tokenizer._tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS)
    return SamplingParams(temperature=0.0, logit_bias={int(i): -100.0 for i in ids})


def noise(seconds: float) -> bytes:
    return np.random.default_rng(0).normal(0, 0.1, int(seconds * SR)).astype("<f4").tobytes()


async def test_chat_tokens_flow_between_session_windows(tiny_loaded: Any, whisper_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(tiny_loaded, max_active=2)
    speech = SpeechService(engine.tasks, whisper_dir, dtype="float32", resident=True)
    options = speech.options(temperatures=(0.0,), without_timestamps=True)
    order: list[str] = []  # what the engine thread ran, in order
    llm_step = engine.group.step.run

    def spy_llm(*args: Any) -> Any:
        order.append("llm")
        return llm_step(*args)

    window_step = WindowedTranscription.step

    def spy_window(self: WindowedTranscription, *args: Any) -> Any:
        order.append("window")
        return window_step(self, *args)

    engine.group.step.run = spy_llm  # type: ignore[method-assign]
    monkeypatch.setattr(WindowedTranscription, "step", spy_window)
    tokens = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await tg.start(speech.run)
        await speech.residency.preload()
        session = speech.create_session(options)
        session.append(noise(95), PcmFormat())  # three full windows, each one task
        request = GenerationRequest([5, 6, 7, 8], no_eos(tiny_loaded), max_tokens=400)
        async with engine.submit(request) as stream:
            async for delta in stream:
                tokens += len(delta.token_ids)
                assert delta.finish_reason is None, "the chat ended before the windows: nothing interleaved"
                if session.windows_done == 3:
                    break
        transcript = await session.finish()
        tg.cancel_scope.cancel()
    engine.close()
    assert transcript.duration == pytest.approx(95.0)
    windows = [i for i, what in enumerate(order) if what == "window"]
    assert len(windows) >= 3
    during = order[windows[0]:windows[2] + 1]  # the three capture windows; the finish window comes after the chat
    # between any two window tasks the chat row got at least one model step
    assert "window,window" not in ",".join(during), during
    assert tokens > 0


async def test_deleting_a_session_drops_its_queued_window(tiny_loaded: Any, whisper_dir: Path) -> None:
    engine = Engine(None)
    speech = SpeechService(engine.tasks, whisper_dir, dtype="float32", resident=True)
    options = speech.options(temperatures=(0.0,), without_timestamps=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await tg.start(speech.run)
        await speech.residency.preload()
        a, b = speech.create_session(options), speech.create_session(options)
        a.append(noise(31), PcmFormat())
        await anyio.wait_all_tasks_blocked()  # a's window is running on the engine thread
        b.append(noise(31), PcmFormat())
        await anyio.wait_all_tasks_blocked()  # b's window waits behind it
        assert engine.tasks.labels() == [f"whisper.window:{b.id}"]
        speech.delete_session(b.id)
        await a.finish()
        await engine.tasks.run(lambda: None, label="barrier")
        assert a.windows_done == 2 and b.windows_done == 0 and b._transcription.windows == 0
        assert engine.tasks.labels() == []
        tg.cancel_scope.cancel()
    engine.close()
