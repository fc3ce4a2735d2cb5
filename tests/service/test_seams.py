"""The seams of service/seams.py: the real engine and speech service and the tests' fake satisfy them —
at run time (members present) and for mypy, which checks this module in `.ci/run` (signatures match)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.seams import ChatEngine
from tests.service.fake_engine import FakeEngine

if TYPE_CHECKING:
    from audio.speech import SpeechService
    from engine.runtime import Engine
    from service.seams import SpeechBackend

    def _conformance(engine: Engine, fake: FakeEngine, speech: SpeechService) -> tuple[ChatEngine, ChatEngine,
                                                                                       SpeechBackend]:
        return engine, fake, speech  # mypy fails here when a signature drifts from the Protocol


def test_fake_engine_is_a_chat_engine() -> None:
    assert isinstance(FakeEngine(), ChatEngine)


def test_engine_is_a_chat_engine() -> None:
    from engine.runtime import Engine

    engine = Engine(None)
    try:
        assert isinstance(engine, ChatEngine)
    finally:
        engine.close()


def test_an_object_missing_a_member_is_not_a_chat_engine() -> None:
    fake = FakeEngine()
    del fake.tasks
    assert not isinstance(fake, ChatEngine)
