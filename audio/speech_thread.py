"""Where Whisper's steps run beside chat: a thread of their own (TANDEM_SPEECH_THREAD), its CPU priority below chat's
(TANDEM_SPEECH_NICE), and whether it takes turns with chat's steps (TANDEM_SPEECH_TURNS) — each default measured."""

from __future__ import annotations

import os

from engine.accelerator import on_gpu

__all__ = ["SPEECH_NICE", "step_thread_default", "speech_nice_default", "speech_turns_default"]


def step_thread_default() -> bool:
    """Whether Whisper steps get a thread of their own when not told: yes unless TANDEM_SPEECH_THREAD=off. On the
    H200 beside 4 live sessions the thread took chat's token gap from 8.0 / 21.9 ms (p50 / p99) to 4.9 / 17.7 ms; on
    a 2-core CPU chat's p99 beside them went from 2.2-2.7x its p99 alone to 1.2-1.6x, and the sessions fell less
    behind (lag 9.3 s against 17.1 s). Raises nothing."""
    return os.environ.get("TANDEM_SPEECH_THREAD", "on").lower() != "off"


SPEECH_NICE = 19  # on MLX's CPU backend; a GPU is shared by launching work, which a CPU priority does not order


def speech_nice_default() -> int:
    """How much lower the Whisper step thread's CPU priority is than the chat threads': TANDEM_SPEECH_NICE, else 19
    where MLX computes on the CPU and 0 on a GPU. On a 2-core CPU beside 4 live sessions chat's token gap p99 was
    1.65-1.91x its p99 alone at nice 0, 1.44-1.69x at 10 and 1.34-1.57x at 19, speech finishing fewer windows while
    chat ran and as many without it (bench/RESULTS.md, twelfth and thirteenth sessions). Engine side (imports MLX).
    Raises nothing."""
    chosen = os.environ.get("TANDEM_SPEECH_NICE", "").strip()
    if chosen:
        try:
            return min(19, max(0, int(chosen)))
        except ValueError:
            pass
    return 0 if on_gpu() else SPEECH_NICE


def speech_turns_default() -> bool:
    """Whether Whisper steps on their own thread take turns with chat's (one step per chat step while chat has rows):
    TANDEM_SPEECH_TURNS=on; off by default. On a 2-core CPU beside 4 live sessions turns took chat's p99 from 118 to
    110 ms, but one speaker dictating beside a streaming chat saw its first words 5.5-7.1 s after speech onset
    instead of 2.0-2.3 s (bench/RESULTS.md, fourteenth session): for chat-first deployments only. Raises nothing."""
    return os.environ.get("TANDEM_SPEECH_TURNS", "").strip().lower() == "on"
