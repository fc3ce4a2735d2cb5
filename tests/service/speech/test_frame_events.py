"""The first event a live socket sends, in the shape its client reads: beta's, GA's, and the binary-frame mode's
(the format its frames are read as)."""

from __future__ import annotations

from audio.pcm import PcmFormat
from service.speech.frame_events import created_event
from service.speech.realtime_config import RealtimeConfig


def test_the_created_event_is_in_the_shape_its_client_reads() -> None:
    config, frames = RealtimeConfig(), PcmFormat(rate=8000, encoding="ulaw")
    beta = created_event(config, True, "beta", "s1", "tiny", frames)
    assert beta["type"] == "transcription_session.created" and "id" not in beta
    ga = created_event(config, True, "ga", "s1", "tiny", frames)
    assert ga["type"] == "session.created" and ga["id"] == "s1"
    assert ga["session"]["audio"]["input"]["format"]["type"] == "audio/pcm"  # JSON appends: the Realtime format
    binary = created_event(config, False, "ga", "s1", "tiny", frames)
    assert binary["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 8000, "encoding": "ulaw"}
