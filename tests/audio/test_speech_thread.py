"""audio/speech_thread.py: Whisper steps' own thread unless told off, their CPU priority below chat's, and their
turns with chat only when told."""

from __future__ import annotations

import mlx.core as mx

from audio.speech_thread import SPEECH_NICE, speech_nice_default, speech_turns_default, step_thread_default


def test_whisper_steps_run_at_a_lower_cpu_priority_on_the_cpu_unless_told(monkeypatch) -> None:
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    monkeypatch.delenv("TANDEM_SPEECH_NICE", raising=False)
    assert speech_nice_default() == (SPEECH_NICE if on_cpu else 0)
    for env, expected in [("0", 0), ("5", 5), ("50", 19), ("-3", 0), ("x", SPEECH_NICE if on_cpu else 0)]:
        monkeypatch.setenv("TANDEM_SPEECH_NICE", env)
        assert speech_nice_default() == expected, env


def test_whisper_steps_take_turns_with_chat_only_when_told(monkeypatch) -> None:
    monkeypatch.delenv("TANDEM_SPEECH_TURNS", raising=False)
    assert speech_turns_default() is False  # a dictation beside a streaming chat waited 3-5 s longer with turns
    for env, expected in [("on", True), ("ON", True), ("off", False), ("x", False)]:
        monkeypatch.setenv("TANDEM_SPEECH_TURNS", env)
        assert speech_turns_default() is expected, env


def test_whisper_steps_get_their_own_thread_unless_told_off(monkeypatch) -> None:
    for env, expected in [(None, True), ("off", False), ("OFF", False), ("on", True), ("auto", True)]:
        if env is None:
            monkeypatch.delenv("TANDEM_SPEECH_THREAD", raising=False)
        else:
            monkeypatch.setenv("TANDEM_SPEECH_THREAD", env)
        assert step_thread_default() is expected, env
