"""service/speech/sessions.py and the live sockets with API keys: one key holds at most its share of
--max-sessions (--key-session-share) while other keys still get in; a single key, or none, is never capped. And the
chunks a session takes: a browser's MediaRecorder stream POSTed blob by blob (only the first with the container's
header) is decoded as it arrives; whole files each with their header still work; a body that opens with a
container's header is that container whatever its type; the decoded audio keeps --max-audio-seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.exceptions import WebSocketDisconnect
from litestar.testing import TestClient

from audio.pcm import SAMPLE_RATE, decode_container
from audio.pcm_headers import pcm_header
from service.app import create_app
from service.config import ServiceConfig
from service.limits import Limits
from service.speech.setup import SpeechConfig, install_speech, key_session_cap
from service.state import AppState
from tests.fixtures.container_streams import encode, pieces, tone
from tests.fixtures.piped_audio import piped, wave_tone
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.speech.test_routes import voiced, wav_bytes

RT = "/v1/realtime?intent=transcription"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


def _client(whisper_dir: Path, keys: list[str], **speech: Any) -> TestClient[Any]:
    state = install_speech(AppState(config=ServiceConfig(api_keys=keys)),
                           SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=4, **speech))
    return TestClient(create_app(state))


@pytest.fixture
def two_keys(whisper_dir: Path) -> Iterator[TestClient[Any]]:
    with _client(whisper_dir, ["alpha", "beta"]) as c:
        yield c


def test_one_key_holds_at_most_its_share_while_another_still_gets_in(two_keys: TestClient[Any]) -> None:
    # One client could take every place: the other key's dictation was refused for as long as it held them.
    for _ in range(2):  # half of 4 by default
        assert two_keys.post("/v1/audio/sessions", json={}, headers=bearer("alpha")).status_code == 200
    r = two_keys.post("/v1/audio/sessions", json={}, headers=bearer("alpha"))
    assert r.status_code == 429 and r.json()["error"]["code"] == "session_share_reached"
    assert "--key-session-share" in r.json()["error"]["message"] and int(r.headers["retry-after"]) >= 1
    with two_keys.websocket_connect(RT, headers=bearer("alpha")) as ws:  # a socket counts the same
        event = ws.receive_json(timeout=30)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    assert event["error"]["code"] == "session_share_reached" and closed.value.code == 1013
    with two_keys.websocket_connect(RT, headers=bearer("beta")) as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        created = two_keys.post("/v1/audio/sessions", json={}, headers=bearer("beta"))
        assert created.status_code == 200
        assert two_keys.delete(f"/v1/audio/sessions/{created.json()['id']}", headers=bearer("beta")).status_code == 200
    assert two_keys.get("/stats", headers=bearer("beta")).json()["speech"]["max_sessions_per_key"] == 2


def test_a_single_key_is_not_capped(whisper_dir: Path) -> None:
    with _client(whisper_dir, ["alpha"]) as c:
        for _ in range(4):
            assert c.post("/v1/audio/sessions", json={}, headers=bearer("alpha")).status_code == 200
        assert c.post("/v1/audio/sessions", json={}, headers=bearer("alpha")).json()["error"]["code"] == \
            "session_unavailable"


@pytest.mark.parametrize("keys, share, cap", [(0, 0.5, None), (1, 0.5, None), (2, 0.5, 32), (3, 0.25, 16),
                                              (2, 1.0, None), (2, 0.001, 1)])
def test_the_cap_per_key(keys: int, share: float, cap: int | None) -> None:
    assert key_session_cap(SpeechConfig(max_sessions=64, key_session_share=share), keys) == cap


# what each browser's MediaRecorder labels its blobs
BLOB_TYPES = {"webm": "audio/webm;codecs=opus", "ogg": "audio/ogg;codecs=opus", "mp4": "audio/mp4"}


@pytest.fixture(scope="module")
def keyless(whisper_dir: Path) -> Iterator[TestClient[Any]]:
    with _client(whisper_dir, []) as c:
        yield c


def _chunks(client: TestClient[Any], bodies: list[bytes], content_type: str) -> tuple[str, list[Any]]:
    sid = client.post("/v1/audio/sessions", json={"temperature": 1.0}).json()["id"]
    return sid, [client.post(f"/v1/audio/sessions/{sid}/audio", content=body, headers={"content-type": content_type})
                 for body in bodies]


def _finished(client: TestClient[Any], sid: str) -> float:
    r = client.post(f"/v1/audio/sessions/{sid}/finish")
    assert r.status_code == 200, r.text
    client.delete(f"/v1/audio/sessions/{sid}")
    return float(r.json()["duration"])


@pytest.mark.parametrize("name", sorted(BLOB_TYPES))
def test_a_mediarecorder_stream_posted_blob_by_blob_is_taken_whole(keyless: TestClient[Any], name: str) -> None:
    # every blob after the first was a 400 "could not decode ... corrupt", and /finish gave empty text
    data = encode(name, tone(2.0))
    sid, answers = _chunks(keyless, pieces(data, 8), BLOB_TYPES[name])
    assert [r.status_code for r in answers] == [200] * len(answers), answers[-1].text
    received = [r.json()["received_seconds"] for r in answers]
    assert received[0] > 0 and all(b > a for a, b in zip(received, received[1:]))  # each as it arrives
    assert _finished(keyless, sid) == pytest.approx(len(decode_container(data)) / SAMPLE_RATE, abs=1e-3)


def test_whole_wav_blobs_each_with_their_header_still_work(keyless: TestClient[Any]) -> None:
    blobs = [wav_bytes(voiced(0.5)), wav_bytes(voiced(0.25), 8000), wav_bytes(voiced(0.5))]
    sid, answers = _chunks(keyless, blobs, "audio/wav")
    assert [r.json()["received_seconds"] for r in answers] == pytest.approx([0.5, 1.0, 1.5], abs=0.01)
    assert _finished(keyless, sid) == pytest.approx(1.5, abs=0.01)


def test_a_headerless_blob_with_no_stream_open_is_refused_saying_why(keyless: TestClient[Any]) -> None:
    sid, (answer,) = _chunks(keyless, [pieces(encode("webm", tone(2.0)), 8)[2]], BLOB_TYPES["webm"])
    error = answer.json()["error"]
    assert answer.status_code == 400 and (error["param"], error["code"]) == ("body", "missing_stream_header")
    assert "headerless continuation of a WebM, Ogg or MP4 stream" in error["message"]
    assert "whose first chunk" in error["message"] and "corrupt" not in error["message"]
    keyless.delete(f"/v1/audio/sessions/{sid}")


@pytest.mark.parametrize("body", [wav_bytes(voiced(0.75)), encode("webm", tone(0.75))], ids=["wav", "webm"])
def test_a_container_sent_as_raw_pcm_is_decoded_as_what_it_is(keyless: TestClient[Any], body: bytes) -> None:
    # read as samples: the WAV's header became audio, a WebM was "not a whole number of f32le frames" or empty text
    sid, (answer,) = _chunks(keyless, [body], "audio/pcm")
    assert answer.status_code == 200, answer.text
    assert _finished(keyless, sid) == pytest.approx(len(decode_container(body)) / SAMPLE_RATE, abs=1e-3)


def test_a_stream_blob_decoding_past_max_audio_seconds_is_refused(whisper_dir: Path) -> None:
    state = install_speech(AppState(config=ServiceConfig(limits=Limits(max_audio_seconds=1.0))),
                           SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=4))
    parts = pieces(encode("webm", tone(3.0)), 3)
    with TestClient(create_app(state)) as client:
        sid, answers = _chunks(client, [parts[0], parts[1] + parts[2]], BLOB_TYPES["webm"])
        assert answers[0].status_code == 200
        error = answers[1].json()["error"]
        assert answers[1].status_code == 400 and error["code"] == "audio_too_long" and error["param"] == "body"
        assert _finished(client, sid) == pytest.approx(answers[0].json()["received_seconds"], abs=0.05)


def cut(data: bytes, size: int) -> list[bytes]:
    return [data[at:at + size] for at in range(0, len(data), size)]


@pytest.mark.parametrize("fmt, codec, rate, channels, declared", [
    ("wav", "pcm_s16le", 16000, 1, "audio/wav"), ("wav", "pcm_s16le", 48000, 2, "audio/pcm;rate=24000;encoding=s16le"),
    ("wav", "pcm_f32le", 16000, 1, "application/octet-stream"), ("wav", "pcm_mulaw", 8000, 1, "audio/wav"),
    ("au", "pcm_s16be", 22050, 1, "audio/basic")])
def test_a_wav_or_au_piped_in_chunks_is_pcm_in_its_headers_format_whatever_the_chunks_type(
        keyless: TestClient[Any], fmt: str, codec: str, rate: int, channels: int, declared: str) -> None:
    # `arecord -t wav -` POSTed chunk by chunk: the header chunk was decoded as a whole file, and every chunk after
    # it refused `missing_stream_header` (or, sent as audio/pcm, read in the format the type declared)
    data = piped(fmt, codec, wave_tone(1.5, rate), rate, channels)  # FFmpeg's own header, sizes unknown
    header = pcm_header(data)
    assert header is not None and header.length is None
    # the header cut across two chunks, then the samples cut anywhere (odd sizes too)
    bodies = [data[:30], data[30:header.offset], *cut(data[header.offset:], 1001)]
    sid, answers = _chunks(keyless, [b for b in bodies if b], declared)
    assert [r.status_code for r in answers] == [200] * len(answers), [r.text for r in answers if r.status_code != 200]
    assert _finished(keyless, sid) == pytest.approx(1.5, abs=0.01)


@pytest.mark.parametrize("first", [4, 11])
def test_a_piped_wavs_first_chunk_shorter_than_its_signature_waits_for_the_rest(keyless: TestClient[Any],
                                                                               first: int) -> None:
    # `RIFF` alone: the next chunk was decoded as a whole file, then every chunk refused missing_stream_header
    data = piped("wav", "pcm_s16le", wave_tone(1.5, 16000), 16000)
    sid, answers = _chunks(keyless, [data[:first], *cut(data[first:], 8000)], "audio/wav")
    assert [r.status_code for r in answers] == [200] * len(answers), [r.text for r in answers if r.status_code != 200]
    assert _finished(keyless, sid) == pytest.approx(1.5, abs=0.01)


def test_a_stray_short_blob_does_not_refuse_the_stream_after_it(keyless: TestClient[Any]) -> None:
    # a 3-byte audio/webm POST was glued in front of the next recording's header chunk: it and all after it a 400
    data = encode("webm", tone(2.0))
    sid, answers = _chunks(keyless, [b"\x00\x01\x02", *pieces(data, 8)], BLOB_TYPES["webm"])
    assert [r.status_code for r in answers] == [200] * len(answers), [r.text for r in answers if r.status_code != 200]
    assert _finished(keyless, sid) == pytest.approx(len(decode_container(data)) / SAMPLE_RATE, abs=1e-3)


def test_raw_pcm_after_a_short_blob_ends_its_wait(keyless: TestClient[Any]) -> None:
    # the short blob held was glued onto the next container chunk whatever came between
    data = encode("webm", tone(1.0))
    sid, answers = _chunks(keyless, [data[:5]], BLOB_TYPES["webm"])
    raw = keyless.post(f"/v1/audio/sessions/{sid}/audio", content=_s16le(0.5),
                       headers={"content-type": "audio/pcm;encoding=s16le"})
    rest = keyless.post(f"/v1/audio/sessions/{sid}/audio", content=data[5:], headers={"content-type": "audio/webm"})
    assert [answers[0].status_code, raw.status_code, rest.status_code] == [200, 200, 400]
    assert rest.json()["error"]["code"] == "missing_stream_header" and "short chunk" not in rest.text
    assert _finished(keyless, sid) == pytest.approx(0.5, abs=0.01)


def test_a_piped_wav_ends_where_its_header_says_and_a_new_header_starts_the_next(keyless: TestClient[Any]) -> None:
    whole = wav_bytes(wave_tone(1.0, 22050), 22050)  # sizes known, then a trailing LIST chunk as some editors write
    comment = b"recorded at the meeting " * 170  # 4080 bytes: read as samples, 0.09 s of noise
    whole += b"LIST" + (12 + len(comment)).to_bytes(4, "little") + b"INFOICMT" + len(comment).to_bytes(4, "little")
    size = len(whole) + len(comment) - 8  # the RIFF's size counts the LIST, as editors write it
    whole = whole[:4] + size.to_bytes(4, "little") + whole[8:]
    restarted = piped("wav", "pcm_s16le", wave_tone(0.5, 44100), 44100)  # the recorder restarted
    sid, answers = _chunks(keyless, [*cut(whole + comment, 4000), *cut(restarted, 4000)], "audio/wav")
    assert [r.status_code for r in answers] == [200] * len(answers), [r.text for r in answers if r.status_code != 200]
    assert _finished(keyless, sid) == pytest.approx(1.5, abs=0.005)


def _s16le(seconds: float) -> bytes:
    return (voiced(seconds) * 32767).astype("<i2").tobytes()


def test_chunks_after_a_whole_wav_sent_in_pieces_are_read_as_their_type_says(keyless: TestClient[Any]) -> None:
    # A recorded WAV in pieces, then live raw PCM: the chunks after the file's RIFF size were taken by the ended WAV
    # and dropped, each a 200 (a headerless audio/wav one too).
    whole = wav_bytes(wave_tone(1.0, 22050), 22050)
    sid, answers = _chunks(keyless, cut(whole, 10001), "audio/wav")
    assert [r.status_code for r in answers] == [200] * len(answers)
    raw = keyless.post(f"/v1/audio/sessions/{sid}/audio", content=_s16le(0.5),
                       headers={"content-type": "audio/pcm;rate=16000;encoding=s16le"})
    assert raw.status_code == 200 and raw.json()["received_seconds"] == pytest.approx(1.5, abs=0.005), raw.text
    stray = keyless.post(f"/v1/audio/sessions/{sid}/audio", content=_s16le(0.25), headers={"content-type": "audio/wav"})
    assert stray.status_code == 400 and stray.json()["error"]["code"] == "missing_stream_header", stray.text
    assert _finished(keyless, sid) == pytest.approx(1.5, abs=0.005)


def test_samples_a_piped_header_gives_that_cannot_be_read_are_refused_chunk_by_chunk(keyless: TestClient[Any]) -> None:
    wide = piped("wav", "pcm_s24le", wave_tone(0.5, 16000), 16000)
    fine = piped("wav", "pcm_s16le", wave_tone(1.0, 16000), 16000)
    sid, answers = _chunks(keyless, [*cut(wide, 8000), *cut(fine, 8000)], "audio/wav")
    refused = [r.json()["error"] for r in answers if r.status_code != 200]
    assert [e["code"] for e in refused] == ["unsupported_sample_format"] * len(cut(wide, 8000))
    assert refused[0]["param"] == "body" and "24-bit PCM" in refused[0]["message"]
    assert _finished(keyless, sid) == pytest.approx(1.0, abs=0.01)  # never read as noise in another format


def test_audio_appended_over_http_is_counted_in_the_audio_seconds(whisper_dir: Path) -> None:
    # Only the sockets counted their live audio in tandem_whisper_audio_seconds_total: HTTP sessions' was left out.
    state = install_speech(AppState(), SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=4))
    with TestClient(create_app(state)) as client:
        def counted() -> float:
            return float(state.metrics.registry.get_sample_value("tandem_whisper_audio_seconds_total") or 0.0)

        before = counted()
        sid = client.post("/v1/audio/sessions", json={}).json()["id"]
        raw = voiced(0.5).astype("<f4").tobytes()
        webm = pieces(encode("webm", tone(1.0)), 4)  # a stream's tail comes with the next stream: counted too
        wav = cut(piped("wav", "pcm_s16le", wave_tone(1.0, 16000), 16000), 3200)
        for body, kind in [(raw, "audio/pcm"), *[(b, BLOB_TYPES["webm"]) for b in webm], *[(b, "audio/wav") for b in wav]]:
            r = client.post(f"/v1/audio/sessions/{sid}/audio", content=body, headers={"content-type": kind})
            assert r.status_code == 200, r.text
        duration = _finished(client, sid)
    assert duration > 2.4 and counted() - before == pytest.approx(duration, abs=1e-3)

