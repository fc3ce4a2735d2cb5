"""service/speech/client_events.py: a text message decoded as a JSON object or refused by what is wrong with it, and
the first Realtime event or `finish` deciding how an `/v1/audio/live` socket talks, for good."""

from __future__ import annotations

import pytest

from service.http.errors import APIError
from service.speech.client_events import decided_mode, decoded_event, frames_refusal


@pytest.mark.parametrize("text, code", [("[1]", "invalid_event"), ("nope", "invalid_json"),
                                        ('{"a": [[[[1]]]]}', "json_too_deep")])
def test_what_is_not_an_object_within_the_depth_is_refused(text: str, code: str) -> None:
    with pytest.raises(APIError) as caught:
        decoded_event(text, depth_limit=3)
    assert caught.value.code == code
    assert decoded_event('{"type": "finish"}', depth_limit=3) == {"type": "finish"}


def test_the_first_realtime_event_or_finish_decides_and_nothing_undoes_it() -> None:
    assert decided_mode("undecided", "ping") == "undecided"  # an unknown type decides nothing
    assert decided_mode("undecided", "session.update") == "realtime"
    assert decided_mode("undecided", "finish") == "frames"
    assert decided_mode("frames", "session.update") == "frames"
    assert "before any PCM frame" in frames_refusal("input_audio_buffer.clear", "frames").message
    assert "or Realtime client events" in frames_refusal("ping", "undecided").message
