"""audio/speech.py: when live sessions give their places up — idle for the TTL with no work in hand (a session
whose audio is still being transcribed is not idle), the refusal's Retry-After counted to the first session that
can free its place by itself, and one owner's share of the house. A fake clock stands in for time."""

from __future__ import annotations

from pathlib import Path
import anyio
import pytest

from audio.errors import SessionExpired, SessionLimit, SessionNotFound, SessionShareLimit
from audio.pcm import PcmFormat
from audio.scheduler import WhisperScheduler
from audio.sessions import LiveSession
from audio.speech import SpeechService
from audio.window import WindowRequest
from tests.audio.conftest import running_tasks, voiced

pytestmark = pytest.mark.anyio


class Clock:
    """Monotonic seconds the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def service(tasks: object, whisper_dir: Path, clock: Clock, **kwargs: object) -> SpeechService:
    return SpeechService(tasks, whisper_dir, dtype="float32", resident=True, clock=clock, **kwargs)  # type: ignore[arg-type]


async def idle(*sessions: LiveSession) -> None:
    for s in sessions:
        await s.caught_up()


async def test_retry_after_counts_to_the_first_session_that_can_expire(tiny_whisper_dir: Path) -> None:
    clock = Clock()
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, clock, session_ttl_sec=300, max_sessions=2)
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            a = speech.create_session(speech.options())
            clock.now += 100
            b = speech.create_session(speech.options())
            await idle(a, b)
            clock.now += 50.5
            with pytest.raises(SessionLimit) as refused:  # was a fixed 5 s while nothing could free for minutes
                speech.create_session(speech.options())
            assert refused.value.retry_after == 150 and "150 s" in refused.value.message  # a's: 300 - 150.5, up
            assert "--session-ttl" in refused.value.message
            a.touch()  # its client spoke: now b is the first to go
            with pytest.raises(SessionLimit) as refused:
                speech.create_session(speech.options())
            assert refused.value.retry_after == 250
            clock.now += 249.5
            with pytest.raises(SessionLimit) as refused:  # b's moment exactly: at least a second, never 0
                speech.create_session(speech.options())
            assert refused.value.retry_after == 1
            clock.now += 0.5
            speech.create_session(speech.options())  # b expired; a stays
            assert b.id not in speech.sessions and a.id in speech.sessions
            tg.cancel_scope.cancel()


async def test_a_session_whose_audio_is_being_transcribed_is_not_idle(tiny_whisper_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = anyio.Event(), anyio.Event()
    real = WhisperScheduler.decode

    async def held(self: WhisperScheduler, loaded: object, request: WindowRequest, scope: object = None) -> object:
        entered.set()
        await release.wait()
        return await real(self, loaded, request, scope)  # type: ignore[arg-type]

    monkeypatch.setattr(WhisperScheduler, "decode", held)
    clock = Clock()
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, clock, session_ttl_sec=60, max_sessions=1)
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            s = speech.create_session(speech.options(vad=False, temperatures=(0.0,)))
            s.append(voiced(2.0).tobytes(), PcmFormat())
            await entered.wait()  # a decode of its audio is running
            clock.now += 61
            speech._expire(clock())
            assert s.busy and speech.get_session(s.id) is s
            with pytest.raises(SessionLimit) as refused:
                speech.create_session(speech.options())
            assert "in use" in refused.value.message and refused.value.retry_after == 60
            release.set()
            await s.caught_up()  # the decode's end counts as activity: the TTL runs from there
            assert not s.busy and s.last_active == clock()
            clock.now += 59
            speech._expire(clock())
            assert speech.get_session(s.id) is s
            clock.now += 2
            speech._expire(clock())
            with pytest.raises(SessionNotFound):
                speech.get_session(s.id)
            assert s.expired is not None and "--session-ttl" in s.expired and "60 s" in s.expired
            with pytest.raises(SessionExpired):
                await s.finish()
            with pytest.raises(SessionExpired):
                s.append(voiced(0.1).tobytes(), PcmFormat())
            tg.cancel_scope.cancel()


async def test_one_owner_holds_at_most_its_share(tiny_whisper_dir: Path) -> None:
    clock = Clock()
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, clock, session_ttl_sec=300, max_sessions=4, max_owner_sessions=2)
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            first = speech.create_session(speech.options(), owner="key-a")
            clock.now += 10
            speech.create_session(speech.options(), owner="key-a")
            with pytest.raises(SessionShareLimit) as refused:
                speech.create_session(speech.options(), owner="key-a")
            assert refused.value.code == "session_share_reached" and refused.value.retry_after == 290
            assert isinstance(refused.value, SessionLimit)  # a 429 as a full house is
            speech.create_session(speech.options(), owner="key-b")  # another key still gets in
            speech.create_session(speech.options(), owner="key-b")
            with pytest.raises(SessionLimit) as full:
                speech.create_session(speech.options(), owner="key-c")
            assert not isinstance(full.value, SessionShareLimit)
            await idle(*speech.sessions.values())
            clock.now += 291  # key-a's first expires: key-a may open one again
            speech.create_session(speech.options(), owner="key-a")
            assert first.id not in speech.sessions and first.expired
            tg.cancel_scope.cancel()


async def test_sessions_without_an_owner_are_not_capped(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, Clock(), max_sessions=3, max_owner_sessions=1)
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            for _ in range(3):
                speech.create_session(speech.options())
            assert speech.stats()["max_sessions_per_key"] == 1
            tg.cancel_scope.cancel()
