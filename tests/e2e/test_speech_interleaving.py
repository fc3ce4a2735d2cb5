"""Chat and speech on one loop: with a chat stream and four live sessions running, Whisper steps run on a thread
of their own (the default) and never on the engine thread; with them between chat steps instead, the chat stream
never waits more than one Whisper step per iteration; Whisper steps shrink to their share of a chat iteration
while chat decodes; a deleted session's queued work never runs. The order of what the engine thread ran
and the work each step did are observed, never time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import anyio
import numpy as np
import pytest

from audio.pcm import PcmFormat
from audio.scheduler import StepBudget, WhisperScheduler
from audio.speech import SpeechService
from engine.batch import LLMBatchGroup
from engine.step import BatchStep
from engine.contracts import GenerationRequest, SamplingParams
from engine.runtime import Engine
from tests.fixtures.settle import settle
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


def voiced(seconds: float, f0: float) -> bytes:
    t = np.arange(int(seconds * SR)) / SR
    saw = ((t * f0) % 1.0 - 0.5) * 0.5
    return (saw * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype("<f4").tobytes()


def record(engine: Engine, order: list[str]) -> None:
    """Log every piece of engine-thread work: an LLM iteration, a Whisper step, or another task."""
    run = engine.thread.run

    async def spy(fn: Any, *args: Any) -> Any:
        owner = getattr(fn, "__self__", None)
        order.append("llm" if isinstance(owner, (LLMBatchGroup, BatchStep)) else
                     "whisper" if isinstance(owner, WhisperScheduler) else "task")
        return await run(fn, *args)

    engine.thread.run = spy  # type: ignore[method-assign]


@dataclass
class Beside:
    """What a chat streaming beside 4 live sessions left: the engine thread's work while it streamed, the service."""
    during: list[str]
    speech: SpeechService
    finished: list[Any]
    own_thread: bool
    steps: int  # Whisper steps while the chat streamed


async def chat_beside_four_sessions(tiny_loaded: Any, whisper_dir: Path, step_thread: bool | None) -> Beside:
    engine = Engine(tiny_loaded, max_active=2)
    speech = SpeechService(engine.tasks, whisper_dir, dtype="float32", resident=True, step_thread=step_thread)
    options = speech.options(temperatures=(0.0,))
    order: list[str] = []
    record(engine, order)
    c = speech.scheduler.counters
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await tg.start(speech.run)
        await speech.residency.preload()
        sessions = [speech.create_session(options) for _ in range(4)]
        start, steps_before = len(order), c.encoder_steps + c.decoder_steps
        finished = await chat_while_sessions_speak(engine, tiny_loaded, tg, sessions, 3.0, lambda k: 110 + 40 * k)
        order.append("chat-end")
        own_thread = speech.stats()["scheduler"]["own_thread"]  # while run() runs
        tg.cancel_scope.cancel()
    engine.close()
    assert [t.duration for t in finished] == pytest.approx([3.0] * 4)
    assert all(s.windows_done >= 1 for s in sessions), [s.windows_done for s in sessions]
    return Beside(order[start:order.index("chat-end")], speech, finished, own_thread,
                  c.encoder_steps + c.decoder_steps - steps_before)


async def test_chat_waits_at_most_one_whisper_step_per_iteration(tiny_loaded: Any, whisper_dir: Path) -> None:
    run = await chat_beside_four_sessions(tiny_loaded, whisper_dir, step_thread=False)
    during = run.during
    assert not run.own_thread and during.count("whisper") >= 20 and during.count("llm") >= 20
    first_llm = during.index("llm")
    work = ",".join(during[first_llm:])
    # between two LLM iterations at most one task ran: never two Whisper steps (or any tasks) back to back
    assert "whisper,whisper" not in work and "whisper,task" not in work and "task,whisper" not in work, work
    assert run.speech.scheduler.counters.max_rows >= 2  # the sessions' rows shared decoder steps


async def test_by_default_whisper_steps_run_beside_chat_never_between_its_iterations(tiny_loaded: Any,
                                                                                     whisper_dir: Path) -> None:
    run = await chat_beside_four_sessions(tiny_loaded, whisper_dir, step_thread=None)  # None: the default
    assert run.during.count("llm") >= 20 and "whisper" not in run.during, run.during  # chat's thread: chat only
    assert run.own_thread and run.steps >= 20  # speech went on, on its own thread


async def test_whisper_steps_shrink_while_chat_decodes(tiny_loaded: Any, whisper_dir: Path) -> None:
    engine = Engine(tiny_loaded, max_active=2)
    # a share no unit fits: every step while chat decodes does the least that still moves speech
    speech = SpeechService(engine.tasks, whisper_dir, dtype="float32", resident=True, step_thread=False,
                           budget=StepBudget(chat_share=1e-6), pace=engine.chat_pace)
    options = speech.options(temperatures=(0.0,))
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await tg.start(speech.run)
        await speech.residency.preload()
        alone = speech.create_session(options)
        alone.append(voiced(2.0, 150), PcmFormat())
        await alone.finish()
        before_chat = list(speech.scheduler.counters.steps)
        sessions = [speech.create_session(options) for _ in range(2)]
        finished = await chat_while_sessions_speak(engine, tiny_loaded, tg, sessions, 2.0, lambda k: 120 + 50 * k)
        tg.cancel_scope.cancel()
    engine.close()
    assert before_chat and all(s.limit is None for s in before_chat)  # no chat: the full budget
    assert 375 in {s.work for s in before_chat if s.kind == "encode"}  # a conv or layer unit of 375 positions
    during = [s for s in speech.scheduler.counters.steps if s.limit is not None]
    assert len(during) >= 20
    # one unit a step: a granule of 64 positions (less at a stage's end), or one fixed unit
    assert max(s.work for s in during if s.kind == "encode") <= 64
    # one row a forward, its prompt fed 8 tokens at a time
    assert max(s.work for s in during if s.kind == "decode") <= 8 + 3
    assert all(t.duration == pytest.approx(2.0) for t in finished)


async def test_deleting_a_session_drops_its_queued_work(whisper_dir: Path) -> None:
    engine = Engine(None)  # stepped by hand below, then served
    speech = SpeechService(engine.tasks, whisper_dir, dtype="float32", resident=True, step_thread=False)
    options = speech.options(temperatures=(0.0,))
    async with anyio.create_task_group() as tg:
        await tg.start(speech.run)
        preload = engine.tasks.enqueue(speech.residency._ensure_loaded, label="whisper.load")
        await engine.tasks.advance(engine.thread)
        await preload
        a, b = speech.create_session(options), speech.create_session(options)
        a.append(voiced(3, 150), PcmFormat())
        b.append(voiced(3, 200), PcmFormat())
        await settle()
        assert speech.scheduler.in_flight == 2 and engine.tasks.labels() == ["whisper.step"]
        speech.delete_session(b.id)
        assert speech.scheduler.in_flight == 1  # gone before the next step runs
        tg.start_soon(engine.serve)
        await a.finish()
        await engine.tasks.run(lambda: None, label="barrier")
        assert a.windows_done >= 1 and b.windows_done == 0 and speech.scheduler.in_flight == 0
        assert engine.tasks.labels() == []
        tg.cancel_scope.cancel()
    engine.close()


async def chat_while_sessions_speak(engine: Engine, loaded: Any, tg: Any, sessions: list[Any], seconds: float,
                                    pitch: Callable[[int], float]) -> list[Any]:
    """Stream one endless chat; each chat delta feeds every session 0.25 s of voiced audio until `seconds`,
    then finishes them. Returns their transcripts once all are done (the chat still running)."""
    finished: list[Any] = []

    async def finish(session: Any) -> None:
        finished.append(await session.finish())

    request = GenerationRequest([5, 6, 7, 8], no_eos(loaded), max_tokens=2000)
    async with engine.submit(request) as stream:
        fed = 0.0
        async for delta in stream:
            assert delta.finish_reason is None, "the chat ended before the sessions: nothing interleaved"
            if fed < seconds:  # live audio arrives while the chat streams
                for k, s in enumerate(sessions):
                    s.append(voiced(0.25, pitch(k)), PcmFormat())
                fed += 0.25
                if fed >= seconds:
                    for s in sessions:
                        tg.start_soon(finish, s)
            elif len(finished) == len(sessions):
                break
    return finished
