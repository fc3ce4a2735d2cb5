"""Session events → Realtime server events: an item's deltas add up to its completed transcript, which comes
without Whisper's leading space."""

from __future__ import annotations

from audio.live import SessionEvent
from service.speech.realtime_events import Items, server_events


def test_an_items_text_has_no_leading_space_and_its_deltas_add_up_to_it() -> None:
    items = Items()
    out = [e for ev in [SessionEvent("committed", text=" ", item=0), SessionEvent("committed", text=" And Mr.", item=0),
                        SessionEvent("committed", text=" Dashwood", item=0),
                        SessionEvent("utterance", text="  And Mr. Dashwood", item=0),
                        SessionEvent("committed", text=" Then", item=1), SessionEvent("utterance", text=" Then", item=1)]
           for e in server_events(ev, items, tentative=False)]
    deltas = [e["delta"] for e in out if e["type"].endswith(".delta")]
    done = [e["transcript"] for e in out if e["type"].endswith(".completed")]
    assert deltas == ["And Mr.", " Dashwood", "Then"]  # a blank first delta is no delta
    assert done == ["And Mr. Dashwood", "Then"] == ["".join(deltas[:2]), deltas[2]]
