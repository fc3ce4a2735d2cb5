"""The live-transcription websockets: `/v1/realtime?intent=transcription` (OpenAI's Realtime transcription
events) and `/v1/audio/live` (the same events once the client speaks JSON, or binary PCM frames for simple
clients). service/speech/live_socket.py serves each connection.

Browsers connect as OpenAI's clients do: subprotocols `realtime`, `openai-insecure-api-key.<key or client secret>`
(the guard reads the key there) and, for the beta dialect, `openai-beta.realtime-v1`. The server selects `realtime`
(else the beta one), without which a browser fails the connection, and never echoes the key's. A socket opened with
a client secret starts with the session settings given when it was minted (service/speech/client_secrets.py), and
needs no `intent` (the JS SDK sends only `?model=`)."""

from __future__ import annotations

import logging
from typing import Any

from litestar import WebSocket, websocket

from audio.pcm import SAMPLE_RATE, parse_pcm_content_type
from service.http.auth import offered_key, subprotocols
from service.http.errors import APIError, api_error, error_event, frames_error_event
from service.http.query import refuse_unknown_query
from service.speech.live_socket import LiveSocket, Mode
from service.speech.socket_errors import close_code
from service.speech.client_secrets import ClientSecret
from service.speech.realtime_config import ConfigError, Dialect, RealtimeConfig
from service.speech.served import served_speech
from service.state import AppState, get_state

__all__ = ["live", "realtime", "REALTIME_PROTOCOL", "BETA_PROTOCOL"]

_log = logging.getLogger(__name__)

REALTIME_PROTOCOL = "realtime"
BETA_PROTOCOL = "openai-beta.realtime-v1"  # a browser's way of saying `OpenAI-Beta: realtime=v1`


def _dialect(socket: WebSocket[Any, Any, Any]) -> Dialect:
    # The beta SDK (client.beta.realtime) sends `OpenAI-Beta: realtime=v1`, in a browser the subprotocol
    # openai-beta.realtime-v1: it gets transcription_session.*
    beta = "realtime=v1" in (socket.headers.get("openai-beta") or "").replace(" ", "")
    return "beta" if beta or BETA_PROTOCOL in subprotocols(socket.scope) else "ga"


async def _accept(socket: WebSocket[Any, Any, Any]) -> None:
    # A browser fails the connection unless one of the subprotocols it offered is selected: `realtime`, as OpenAI's
    # server does, else the beta dialect's (never the key's, which would echo it).
    offered = subprotocols(socket.scope)
    chosen = next((p for p in (REALTIME_PROTOCOL, BETA_PROTOCOL) if p in offered), None)
    if offered and chosen is None:
        _log.warning("%s: the client offered websocket subprotocols but not %r; a browser closes such a connection "
                     "at once (offer %r beside the key's)", socket.scope.get("path"), REALTIME_PROTOCOL,
                     REALTIME_PROTOCOL)
    await socket.accept(subprotocols=chosen)


def _secret(socket: WebSocket[Any, Any, Any], state: AppState) -> ClientSecret | None:
    """The client secret the socket was opened with, None for an API key or none. Raises nothing."""
    key = offered_key(socket.scope)
    return state.client_secrets.find(key) if key is not None else None


def _implied_transcription(socket: WebSocket[Any, Any, Any], state: AppState, model: str | None) -> bool:
    """No `intent`: a transcription session all the same when opened with a client secret (they open nothing else,
    and OpenAI prefers the secret's session type) or for a Whisper model this server serves (the JS SDK's
    `?model=`). Raises nothing."""
    if _secret(socket, state) is not None:
        return True
    try:
        return bool(model) and served_speech(state, model) is not None
    except Exception:  # noqa: BLE001 — not a served Whisper model: the intent stays unknown
        return False


def _minted(socket: WebSocket[Any, Any, Any], state: AppState, config: RealtimeConfig) -> RealtimeConfig:
    """`config` with the session settings of the client secret the socket was opened with, applied as its first
    update would be (none: `config`). Raises APIError 400 (they were checked when it was minted)."""
    secret = _secret(socket, state)
    if secret is None or secret.session is None:
        return config
    try:
        return config.updated(secret.session, secret.dialect)
    except ConfigError as exc:
        raise APIError(400, f"the client secret's session: {exc.message}", param=exc.param, code=exc.code) from None


async def _refuse(socket: WebSocket[Any, Any, Any], exc: Exception, realtime: bool = False) -> None:
    # /v1/realtime speaks only Realtime: OpenAI's error event, without the flat fields /v1/audio/live's frame
    # clients read (that socket does not know yet which kind of client it serves)
    err = api_error(exc)
    await socket.send_json(error_event(err) if realtime else frames_error_event(err))
    await socket.close(code=close_code(err))


def _known_query(socket: WebSocket[Any, Any, Any], known: set[str]) -> None:
    """Raises APIError 400 naming a query parameter the route does not read (a typo must not pass as a default); Azure's
    api-version passes (service/http/query.py)."""
    refuse_unknown_query(socket.query_params, known, f"this socket reads {', '.join(sorted(known))}")


def _number(text: str | None, name: str, kind: type[int] | type[float], default: float) -> float:
    """A numeric query parameter. Raises APIError 400 naming it."""
    if text is None:
        return default
    try:
        return kind(text)
    except ValueError:
        raise APIError(400, f"{name} must be {'an integer' if kind is int else 'a number'}, not {text[:40]!r}",
                       param=name, code="invalid_value") from None


def _flag(text: str, name: str) -> bool:
    """A true/false query parameter (true/false, 1/0, yes/no, on/off). Raises APIError 400 naming it."""
    value = {"true": True, "1": True, "yes": True, "on": True,
             "false": False, "0": False, "no": False, "off": False}.get(text.strip().lower())
    if value is None:
        raise APIError(400, f"{name} must be true or false, not {text[:40]!r}", param=name, code="invalid_value")
    return value


@websocket("/v1/audio/live")
async def live(socket: WebSocket[Any, Any, Any], language: str | None = None, rate: str | None = None,
               encoding: str = "f32le", interval: str | None = None, vad: str | None = None) -> None:
    """Binary messages: PCM frames (`rate`, `encoding`: f32le, s16le, s16be, or G.711's ulaw and alaw, 8 kHz
    unless `rate` says otherwise); a WAV or Sun .au as a recorder writes it to a pipe (`arecord -f S16_LE -t wav -`,
    `ffmpeg … -f wav -`: the header, then the samples, cut into frames anywhere), its samples read in the format its
    header gives (rate, channels; 16-bit, float, μ-law or A-law), not the query's: the header is the recording's own
    word, as a file's is over its declared type; or a browser's MediaRecorder stream sent as it records
    (`recorder.start(250)`, each blob one frame): a frame that opens with a container's header (WebM, Ogg,
    fragmented MP4) starts a container stream, and the socket's later binary frames are its pieces, decoded as they
    arrive (a frame with a header starts the next stream); text `{"type":"finish"}` ends capture. The server
    sends `session.created` (with the session `id`), `transcript.partial` {committed, tentative} after each
    change (at most one per `interval` s), then `transcript.done` {text}. A first text message that is a
    Realtime client event (`session.update`, `input_audio_buffer.append`, ...) switches to OpenAI's Realtime
    transcription events instead. Errors arrive as `{"type": "error"}` events; the session goes on."""
    await _accept(socket)
    state = get_state(socket)
    try:
        _known_query(socket, {"language", "rate", "encoding", "interval", "vad"})
        speech = served_speech(state, None)
        # Read as text here: a value the framework failed to convert refused the handshake with a bare 403. No rate
        # given: the encoding's default (16 kHz, G.711's 8 kHz).
        given = "" if rate is None else f";rate={_number(rate, 'rate', int, SAMPLE_RATE)}"
        fmt = parse_pcm_content_type(f"audio/pcm;encoding={encoding}{given}")
        seconds = _number(interval, "interval", float, 0.25)
        if not 0 <= seconds <= 60:
            raise APIError(400, "interval must be 0–60 seconds", param="interval", code="invalid_value")
        # A property of the service, so under --isolate a call that fails while the engine process restarts.
        vad_on = speech.vad_default if vad is None else _flag(vad, "vad")
        start = RealtimeConfig.initial(language=language, vad=vad_on)
        if rate is not None or "encoding" in socket.query_params:
            # The format the query announced holds for Realtime events too: a session.update that names none keeps
            # it (it was OpenAI's 24 kHz pcm16 whatever session.created had shown).
            start.rate, start.encoding = fmt.rate, fmt.encoding
        start.turn_detection_set = vad is not None  # `?vad=` asked for it: a model named later does not change it
        config = _minted(socket, state, start)
        speech = served_speech(state, config.model)
    except Exception as exc:
        await _refuse(socket, exc)
        return
    dialect = _dialect(socket)
    # OpenAI's clients (the header, or in a browser the subprotocols) speak Realtime from the start
    offered = subprotocols(socket.scope)
    realtime_client = socket.headers.get("openai-beta") or REALTIME_PROTOCOL in offered or BETA_PROTOCOL in offered
    mode: Mode = "realtime" if realtime_client else "undecided"
    await LiveSocket(socket, state, speech, config=config, mode=mode, dialect=dialect, frame_format=fmt,
                     interval=seconds).run()


@websocket("/v1/realtime")
async def realtime(socket: WebSocket[Any, Any, Any], intent: str | None = None, model: str | None = None) -> None:
    """OpenAI's Realtime API for transcription sessions (`intent=transcription`): client events
    `transcription_session.update` / `session.update`, `input_audio_buffer.append` / `.commit` / `.clear`;
    server events `transcription_session.created` / `.updated` (beta clients, `OpenAI-Beta: realtime=v1`) or
    `session.created` / `.updated`, `input_audio_buffer.speech_started` / `speech_stopped` / `committed` /
    `cleared`, `conversation.item.created` (GA clients: `conversation.item.added` and `.done`),
    `conversation.item.input_audio_transcription.delta` / `.completed`, and `error`. Browsers: subprotocols as
    OpenAI's clients send them (the module's docstring)."""
    await _accept(socket)
    state = get_state(socket)
    try:
        _known_query(socket, {"intent", "model"})
        if intent is None and _implied_transcription(socket, state, model):
            intent = "transcription"
        if intent != "transcription":
            # openai-node's Node client cannot add ?intent: the hint names the way it can open one
            raise APIError(400, "only transcription sessions are served here: connect with ?intent=transcription, or "
                           "name a transcription model as ?model= (e.g. gpt-4o-transcribe or the served Whisper)",
                           param="intent", code="invalid_value")
        speech = served_speech(state, model)
        # a server started with --no-vad, or a realtime-only model (gpt-realtime-whisper): turn detection is off
        # until asked for (vad_default: under --isolate a call, which fails while the engine process restarts)
        config = _minted(socket, state, RealtimeConfig.initial(model=model, vad=speech.vad_default))
        speech = served_speech(state, config.model)
    except Exception as exc:
        await _refuse(socket, exc, realtime=True)
        return
    await LiveSocket(socket, state, speech, config=config, mode="realtime", dialect=_dialect(socket),
                     frame_format=config.pcm_format).run()
