"""Audio a live session takes, from either route (the sockets' frames, the chunks POSTed to a session's audio), counted
in /metrics' live-audio seconds as it is taken: refused audio never, a container stream's tail when it comes."""

from __future__ import annotations

from audio.pcm import SAMPLE_RATE, PcmFormat
from audio.sessions import LiveSession
from service.state import AppState

__all__ = ["append_counted", "append_container_counted", "count_tails", "count_live_audio"]


def append_counted(state: AppState, session: LiveSession, data: bytes, fmt: PcmFormat) -> None:
    """Raw PCM `data` in `fmt` into `session`. Raises what LiveSession.append raises (nothing counted)."""
    session.append(data, fmt)
    count_live_audio(state, fmt.seconds(len(data)))


async def append_container_counted(state: AppState, session: LiveSession, data: bytes) -> int:
    """A container chunk into `session`, no longer than --max-audio-seconds. Returns the 16 kHz samples taken. Raises
    what LiveSession.append_container raises (nothing counted)."""
    samples = await session.append_container(data, max_seconds=state.config.limits.max_audio_seconds)
    count_live_audio(state, samples / SAMPLE_RATE)
    return samples


def count_tails(state: AppState, session: LiveSession) -> None:
    """Count the tails of `session`'s container streams: they come with no chunk (at a finish, an expiry, the next
    stream). Raises nothing."""
    if (metrics := state.metrics) is not None:
        session.on_tail = metrics.observe_live_audio


def count_live_audio(state: AppState, seconds: float) -> None:
    """Counted as it is taken: /metrics shows live audio while sessions run. Raises nothing."""
    if (metrics := state.metrics) is not None:
        metrics.observe_live_audio(seconds)
