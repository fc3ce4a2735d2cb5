"""Session events → Realtime server events: an item's deltas add up to its completed transcript, which comes
without Whisper's leading space."""

from __future__ import annotations

from typing import Any

from audio.live import SessionEvent
from audio.token_logprobs import TokenLogprob
from service.speech.realtime_events import Items, server_events


def test_an_items_text_has_no_leading_space_and_its_deltas_add_up_to_it() -> None:
    items = Items()
    out = [e for ev in [SessionEvent("speech_started", item=0), SessionEvent("speech_started", item=1),
                        SessionEvent("committed", text=" ", item=0), SessionEvent("committed", text=" And Mr.", item=0),
                        SessionEvent("committed", text=" Dashwood", item=0),
                        SessionEvent("utterance", text="  And Mr. Dashwood", item=0),
                        SessionEvent("committed", text=" Then", item=1), SessionEvent("utterance", text=" Then", item=1)]
           for e in server_events(ev, items, tentative=False)]
    deltas = [e["delta"] for e in out if e["type"].endswith(".delta")]
    done = [e["transcript"] for e in out if e["type"].endswith(".completed")]
    assert deltas == ["And Mr.", " Dashwood", "Then"]  # a blank first delta is no delta
    assert done == ["And Mr. Dashwood", "Then"] == ["".join(deltas[:2]), deltas[2]]


def item_of(e: dict[str, Any]) -> str | None:
    return e.get("item_id") or (e.get("item") or {}).get("id")


def test_no_event_names_an_item_before_the_client_was_told_of_it() -> None:
    # manual commits (no speech_started): text LocalAgreement committed before the client's commit is held, and
    # comes as one delta right after committed / conversation.item.created, as OpenAI transcribes a committed buffer
    items = Items()
    script = [SessionEvent("tentative", text=" Eight of", item=0), SessionEvent("committed", text=" Eight of", item=0),
              SessionEvent("committed", text=" spades,", item=0), SessionEvent("tentative", text=" four", item=0),
              SessionEvent("audio_committed", audio_ms=3000, item=0, ref="c1"),
              SessionEvent("committed", text=" four of clubs.", item=0), SessionEvent("tentative", text="", item=0),
              SessionEvent("utterance", text=" Eight of spades, four of clubs.", item=0)]
    out = [e for ev in script for e in server_events(ev, items, tentative=False)]  # a plain OpenAI client
    assert [e["type"].rsplit(".", 1)[-1] for e in out] == ["committed", "created", "delta", "delta", "completed"]
    told: set[str] = set()
    for e in out:
        if e["type"] == "input_audio_buffer.committed":
            told.add(e["item_id"])
        assert item_of(e) in told, e
    deltas = [e["delta"] for e in out if e["type"].endswith(".delta")]
    assert deltas == ["Eight of spades,", " four of clubs."] and "".join(deltas) == out[-1]["transcript"]


def test_a_ga_session_gets_the_ga_item_events_where_a_beta_one_gets_created() -> None:
    # OpenAI's GA sessions send conversation.item.added then .done for a committed buffer; async-openai's GA events
    # know no conversation.item.created (a beta session's), and failed on every utterance
    script = [SessionEvent("committed", text=" Eight of", item=0), SessionEvent("audio_committed", audio_ms=3000, item=0),
              SessionEvent("utterance", text=" Eight of", item=0)]
    ga_items, beta_items = Items(), Items()
    ga = [e for ev in script for e in server_events(ev, ga_items, tentative=False, ga=True)]
    beta = [e for ev in script for e in server_events(ev, beta_items, tentative=False)]
    assert [e["type"] for e in ga] == ["input_audio_buffer.committed", "conversation.item.added",
                                       "conversation.item.done", "conversation.item.input_audio_transcription.delta",
                                       "conversation.item.input_audio_transcription.completed"]
    assert [e["type"] for e in beta] == ["input_audio_buffer.committed", "conversation.item.created",
                                         "conversation.item.input_audio_transcription.delta",
                                         "conversation.item.input_audio_transcription.completed"]
    assert ga[1]["item"] == ga[2]["item"] and ga[1]["item"]["id"] == ga[0]["item_id"] == ga[3]["item_id"]
    assert {k: v for k, v in ga[1]["item"].items() if k != "id"} == {k: v for k, v in beta[1]["item"].items()
                                                                     if k != "id"}
    assert ga[1]["previous_item_id"] is None and ga[1]["item"]["role"] == "user"


def test_a_client_of_our_tentative_extension_gets_manual_commit_text_as_it_comes() -> None:
    # `tandem dictate --no-vad` asks for guesses: it knows items early, so its live text is not held to the commit.
    items = Items()
    script = [SessionEvent("committed", text=" Eight of", item=0), SessionEvent("tentative", text=" spades", item=0),
              SessionEvent("audio_committed", audio_ms=3000, item=0, ref="c1")]
    out = [e for ev in script for e in server_events(ev, items, tentative=True, lag=lambda: 2.5)]
    assert [e["type"].rsplit(".", 1)[-1] for e in out] == ["delta", "tentative", "committed", "created"]
    assert out[1]["lag_seconds"] == 2.5  # the guess says how far behind the session is
    assert {item_of(e) for e in out} == {out[0]["item_id"]}


def test_with_server_vad_speech_started_announces_the_item_and_text_streams_at_once() -> None:
    items = Items()
    script = [SessionEvent("speech_started", audio_ms=500, item=0), SessionEvent("committed", text=" Ten of", item=0),
              SessionEvent("tentative", text=" clubs.", item=0)]
    out = [e for ev in script for e in server_events(ev, items, tentative=True)]
    assert [e["type"].rsplit(".", 1)[-1] for e in out] == ["speech_started", "delta", "tentative"]
    assert {item_of(e) for e in out} == {out[0]["item_id"]}


def logprobs(*tokens: str) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(t, -0.5, tuple(t.encode())) for t in tokens)


def test_asked_for_deltas_and_transcripts_carry_their_tokens_logprobs() -> None:
    # manual commits: the text held until the commit comes as one delta, with the logprobs of all it holds
    script = [SessionEvent("committed", text=" Eight of", item=0, logprobs=logprobs(" Eight", " of")),
              SessionEvent("committed", text=" spades,", item=0, logprobs=logprobs(" spades", ",")),
              SessionEvent("audio_committed", audio_ms=3000, item=0),
              SessionEvent("committed", text=" four", item=0, logprobs=logprobs(" four")),
              SessionEvent("utterance", text=" Eight of spades, four", item=0,
                           logprobs=logprobs(" Eight", " of", " spades", ",", " four")),
              SessionEvent("audio_committed", audio_ms=4000, item=1),
              # a piece decoded before logprobs were asked for: the item's are not known for all of its text
              SessionEvent("committed", text=" Then", item=1), SessionEvent("utterance", text=" Then", item=1)]
    asked, plain = Items(), Items()
    out = [e for ev in script for e in server_events(ev, asked, tentative=False, logprobs=True)]
    deltas = [e for e in out if e["type"].endswith(".delta")]
    done = [e for e in out if e["type"].endswith(".completed")]
    assert [[x["token"] for x in d["logprobs"] or []] for d in deltas] == [["Eight", " of", " spades", ","],
                                                                          [" four"], []]
    assert deltas[0]["logprobs"][0] == {"token": "Eight", "logprob": -0.5, "bytes": list(b"Eight")}  # as its text
    assert deltas[2]["logprobs"] is None and done[1]["logprobs"] is None
    assert [x["token"] for x in done[0]["logprobs"]] == ["Eight", " of", " spades", ",", " four"]
    out = [e for ev in script for e in server_events(ev, plain, tentative=False)]  # not asked for: none shown
    assert not [e for e in out if "logprobs" in e]


def joined(entries: list[dict[str, Any]]) -> str:
    return bytes(b for x in entries for b in x["bytes"]).decode()


def test_each_events_logprobs_join_to_exactly_its_text() -> None:
    # Whisper's first token carries the leading space the text leaves out: its token and bytes leave it out too,
    # its logprob as it was; a blank first piece is no delta, and its token is in no event.
    first = (TokenLogprob(" ", -0.1, (32,)), TokenLogprob(" And", -0.2, tuple(b" And")),
             TokenLogprob(" Mr", -0.3, tuple(b" Mr")), TokenLogprob(".", -0.4, tuple(b".")))
    then = (TokenLogprob(" Dash", -0.5, tuple(b" Dash")), TokenLogprob("wood", -0.6, tuple(b"wood")))
    script = [SessionEvent("speech_started", item=0),
              SessionEvent("committed", text=" ", item=0, logprobs=first[:1]),
              SessionEvent("committed", text=" And Mr.", item=0, logprobs=first[1:]),
              SessionEvent("committed", text=" Dashwood", item=0, logprobs=then),
              SessionEvent("utterance", text="  And Mr. Dashwood", item=0, logprobs=first + then)]
    items = Items()
    out = [e for ev in script for e in server_events(ev, items, tentative=False, logprobs=True)]
    deltas = [e for e in out if e["type"].endswith(".delta")]
    (done,) = [e for e in out if e["type"].endswith(".completed")]
    assert [d["delta"] for d in deltas] == ["And Mr.", " Dashwood"] and done["transcript"] == "And Mr. Dashwood"
    assert [joined(d["logprobs"]) for d in deltas] == [d["delta"] for d in deltas]
    assert joined(done["logprobs"]) == done["transcript"]
    assert deltas[0]["logprobs"][0] == {"token": "And", "logprob": -0.2, "bytes": list(b"And")}
    assert done["logprobs"] == [x for d in deltas for x in d["logprobs"]]


def completed(model: str | None, text: str, language: str | None) -> dict[str, Any]:
    items = Items()
    events = [SessionEvent("speech_started", item=0), SessionEvent("utterance", text=text, item=0, language=language)]
    return [e for ev in events for e in server_events(ev, items, tentative=False, model=model)][-1]


def test_completed_names_the_language_heard_for_the_models_openais_does() -> None:
    # openai-python's ConversationItemInputAudioTranscriptionCompletedEvent.languages, "Returned by gpt-transcribe";
    # LiveKit's stt.py reads `completed.languages` (its first `code`) over the language it asked for
    assert completed("gpt-live-transcribe", " Hello there", "en")["languages"] == [{"code": "en"}]
    assert completed("gpt-transcribe", " Sugeng enjing", "jw")["languages"] == [{"code": "jv"}]  # ISO 639-1
    assert completed("gpt-live-transcribe", " ", "en")["languages"] == []  # nothing heard: no language
    # the other ids' events keep the shape OpenAI gives them (clients that compare keys strictly)
    for model in (None, "whisper-1", "gpt-4o-transcribe", "gpt-realtime-whisper"):
        assert "languages" not in completed(model, " Hello", "en")
