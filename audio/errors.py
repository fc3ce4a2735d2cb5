"""Why speech work is refused — typed, each with a stable `code` and the request `param` at fault, so the
service maps them by type (service/http/errors.py), never by message text."""

from __future__ import annotations

__all__ = [
    "AudioError",
    "AudioInputError",
    "InvalidOption",
    "WhisperCheckpointError",
    "WhisperUnreadableError",
    "SessionError",
    "SessionNotFound",
    "SessionClosed",
    "SessionLimit",
    "SessionShareLimit",
    "SessionExpired",
    "SpeechNotRunning",
    "SpeechStopped",
    "AudioLimitExceeded",
    "SessionAudioLimit",
    "AudioBufferFull",
    "SessionBacklogFull",
    "ChunkOverBacklog",
    "CommitEmpty",
]


class AudioError(Exception):
    """Base of speech errors; `code` is a stable machine-readable string, `param` the field at fault."""

    code = "audio_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class AudioInputError(AudioError, ValueError):
    """Audio a client sent that cannot be used (undecodable, empty, bad rate or encoding)."""

    code = "invalid_audio"


class AudioLimitExceeded(AudioInputError):
    """A chunk would pass a cap; nothing of it was taken and earlier audio is kept. An AudioInputError: a
    400 where nothing maps the subclasses below. `retry_after`: seconds after which retrying may succeed
    (None: it never will)."""

    retry_after: int | None = None

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message, param="body", code=code)


class SessionAudioLimit(AudioLimitExceeded):
    """The session would pass its audio cap (max_session_s): it can take no more, ever."""

    code = "session_audio_limit"


class AudioBufferFull(AudioLimitExceeded):
    """All sessions together hold the most untranscribed audio the server keeps: retry once they caught up."""

    code = "audio_buffer_full"
    retry_after = 2


class ChunkOverBacklog(AudioLimitExceeded):
    """One chunk longer than a session may hold untranscribed (max_lag_s): no retry can take it, smaller ones can."""

    code = "chunk_too_long"


class SessionBacklogFull(AudioLimitExceeded):
    """This session's untranscribed audio would pass max_lag_s: it sends faster than it is transcribed."""

    code = "session_backlog_full"
    retry_after = 2


class CommitEmpty(AudioInputError):
    """A commit with less than 100 ms of audio since the last commit, clear or VAD pause (audio/sessions.py)."""

    code = "input_audio_buffer_commit_empty"


class InvalidOption(AudioError, ValueError):
    """A transcription option this model cannot honour (unknown language, translate on English-only)."""

    code = "invalid_value"


class WhisperCheckpointError(AudioError, ValueError):
    """The model name does not resolve to a Whisper checkpoint (no dir, not cached, not Whisper), or its
    weights do not match its config."""

    code = "model_load_failed"


class WhisperUnreadableError(WhisperCheckpointError):
    """A file of a Whisper checkpoint that resolved cannot be read by this process (its mode or owner: a cache built
    by another user): the model is there, so a server stops at start rather than serve without it."""


class SessionError(AudioError):
    """Base of live-session errors."""

    code = "session_error"


class SessionNotFound(SessionError):
    """No session with that id (unknown, deleted or expired)."""

    code = "session_not_found"

    def __init__(self, message: str, *, param: str | None = "session_id", code: str | None = None) -> None:
        super().__init__(message, param=param, code=code)


class SessionClosed(SessionError):
    """Audio arrived after finish, or the session was deleted/expired."""

    code = "session_closed"


class SessionExpired(SessionClosed):
    """The session's client sent nothing for the session TTL while it had no work in hand: it was dropped to
    free its place (audio/speech.py SpeechService reaps it; a websocket is told with this, then closed)."""

    code = "session_expired"


class SessionLimit(SessionError):
    """max_sessions are open and none is idle enough to expire. `retry_after`: the seconds until the first open
    session can expire by itself (audio/speech.py computes it; one deleted or finished frees a place sooner)."""

    code = "session_unavailable"

    def __init__(self, message: str, *, retry_after: int = 5, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message, param=param, code=code)
        self.retry_after = retry_after


class SessionShareLimit(SessionLimit):
    """The caller's API key holds its share of max_sessions (the fair-share cap); other keys may still open
    sessions. `retry_after` as SessionLimit's, over the key's own sessions."""

    code = "session_share_reached"


class SpeechNotRunning(AudioError, RuntimeError):
    """The SpeechService's run() loop is not running (startup not finished, or shutting down)."""

    code = "session_unavailable"


class SpeechStopped(SpeechNotRunning):
    """The server shuts down: Whisper work still in flight past the shutdown timeout was ended unfinished
    (WhisperScheduler.stop), and later work is refused."""

    code = "shutting_down"
