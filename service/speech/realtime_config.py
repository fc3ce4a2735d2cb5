"""A Realtime transcription session's configuration: what `transcription_session.update` (the beta event) and
`session.update` (the GA event, `session.type = "transcription"`) may set, checked field by field, and the
session object the `.created` / `.updated` events carry, in either dialect.

Every field is honoured or refused with an error naming it. Honoured: the input format (`pcm16` / `audio/pcm`
at 24 kHz, or another declared rate 8–48 kHz, our extension, as is audio/pcm's `encoding`: s16le, f32le, s16be, ulaw
or alaw, what /v1/audio/live's `session.created` shows; G.711 at 8 kHz, `g711_ulaw` / `audio/pcmu` and
`g711_alaw` / `audio/pcma`, as telephony streams it; each dialect's shape: realtime_format.py, which shows a format
beta has no name for as `audio/pcm;rate=…;encoding=…`, taken back), the transcription's model (the served Whisper
under any of its names), language, `languages` (those the speech may be in: Whisper detects it among them),
prompt and `keywords` (joined into the prompt), `delay` (how many consecutive decodes must agree before text is
committed, `DELAY_DECODES`: OpenAI's latency/accuracy hint for gpt-realtime-whisper; beta's update takes it too),
server VAD's `threshold`
(webrtcvad aggressiveness: 0–0.25 → 0, … 0.75–1 → 3), `prefix_padding_ms` (the speech padding, both
sides), `silence_duration_ms` (the pause that ends an utterance), `semantic_vad` served as server VAD whose
`eagerness` sets the pause (`EAGERNESS_SILENCE_MS`: no model judges the turn here, a turn ends on silence),
`turn_detection: null` (no VAD; the client commits; a session for a realtime-only model, `gpt-realtime-whisper` or
`gpt-live-transcribe`, starts so, as OpenAI's: they have no server turn detection, and a client such as LiveKit leaves
the field out and commits itself; one it asks for is served all the same), noise reduction (`noise_reduction` / beta
`input_audio_noise_reduction`, `{"type": "near_field" | "far_field"}`, null off: a high-pass filter over the input
audio before the VAD and Whisper hear it, 80 Hz near field, 120 Hz far field, audio/noise_reduction.py; it cuts
rumble and hum below speech, not noise within it), and `include`: `item.input_audio_transcription.logprobs` (the log
probabilities of the tokens of each delta and `completed` transcript, as Whisper sampled them) and
`item.input_audio_transcription.tentative` (our extension: the current guess after the committed text, as
`conversation.item.input_audio_transcription.tentative` events). Refused: responses (`create_response`,
`interrupt_response`, `idle_timeout_ms`: a transcription session creates none), audio output, and anything unknown.
An update refused is applied in nothing (`updated` works on a copy).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

from audio.noise_reduction import KINDS as NOISE_KINDS
from audio.pcm import PcmFormat
from service.speech.config_error import ConfigError, known_fields
from service.speech.realtime_format import DEFAULT_RATE, InputEncoding, beta_format, ga_format, shown_beta, shown_ga
from service.speech.transcription_fields import aggressiveness, joined_prompt, vad_options

__all__ = ["RealtimeConfig", "ConfigError", "Dialect", "TENTATIVE", "LOGPROBS", "INCLUDES", "DEFAULT_RATE",
           "EAGERNESS_SILENCE_MS", "DELAY_DECODES", "REALTIME_ONLY_MODELS", "field_paths"]

Dialect = Literal["beta", "ga"]
TurnType = Literal["server_vad", "semantic_vad"]
TENTATIVE = "item.input_audio_transcription.tentative"
LOGPROBS = "item.input_audio_transcription.logprobs"
INCLUDES = (LOGPROBS, TENTATIVE)  # every `include` value a session takes
# semantic_vad's eagerness as the pause that ends a turn: OpenAI's "how soon it ends a turn", `auto` its `medium`;
# low waits twice server VAD's default, high half of it (its model would also end a turn it judges finished sooner)
EAGERNESS_SILENCE_MS = {"low": 1000, "medium": 500, "auto": 500, "high": 250}
# `delay` as how many consecutive decodes must agree before text is committed (audio/agreement.py): more waits a
# decode (about a second of speech) longer for text that is less often a word cut at the audio's edge; unset, two
DELAY_DECODES = {"minimal": 1, "low": 2, "medium": 2, "high": 3, "xhigh": 4}
_SEMANTIC_FIELDS = {"type", "eagerness", "create_response", "interrupt_response"}
# OpenAI's transcription models with no server turn detection (openai-python: "For `gpt-realtime-whisper`
# transcription sessions, turn detection must be set to `null`"; LiveKit's stt.py: they "reject turn_detection and emit
# no speech_started/stopped, so the client commits the buffer"): a session for one has none until the client asks
REALTIME_ONLY_MODELS = frozenset({"gpt-realtime-whisper", "gpt-live-transcribe"})


@dataclass
class TurnDetection:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    type: TurnType = "server_vad"
    eagerness: str = "auto"  # semantic_vad's, as the client sent it; it set silence_duration_ms

    @property
    def aggressiveness(self) -> int:
        return aggressiveness(self.threshold)


def field_paths(session: Any, dialect: Dialect) -> tuple[str, str]:
    """Where a session object's transcription and turn-detection settings sit, for errors naming them: the beta
    shape unless the dialect is GA or the object carries GA's `type` (as `updated` reads it). Raises nothing."""
    if dialect == "beta" and not (isinstance(session, dict) and "type" in session):
        return "session.input_audio_transcription", "session.turn_detection"
    return "session.audio.input.transcription", "session.audio.input.turn_detection"


@dataclass
class RealtimeConfig:
    """The effective configuration of one transcription session."""

    rate: int = DEFAULT_RATE
    encoding: InputEncoding = "s16le"
    model: str | None = None
    language: str | None = None
    languages: list[str] = field(default_factory=list)  # as sent: the speech service reads them (options)
    prompt: str | None = None
    keywords: list[str] = field(default_factory=list)
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    tentative: bool = False
    logprobs: bool = False
    noise_reduction: str | None = None  # one of audio/noise_reduction.py's KINDS
    delay: str | None = None  # one of DELAY_DECODES, as sent (None: not sent)
    vad_default: bool = True  # server VAD unless the client says otherwise (False: a server run with --no-vad)
    turn_detection_set: bool = False  # the client named turn_detection; until it does, the default follows the model

    @classmethod
    def initial(cls, model: str | None = None, language: str | None = None, vad: bool = True) -> "RealtimeConfig":
        """A session's settings before any update, for `model` (None: the served Whisper); `vad`: the server's
        default (--no-vad: False). Raises nothing."""
        config = cls(model=model, language=language, vad_default=vad)
        config.turn_detection = config.default_turn_detection()
        return config

    def default_turn_detection(self) -> "TurnDetection | None":
        """The turn detection a session has while its client has not set one: none for a realtime-only model or
        on a server run with --no-vad, else server VAD's defaults. Raises nothing."""
        return TurnDetection() if self.vad_default and self.model not in REALTIME_ONLY_MODELS else None

    @property
    def pcm_format(self) -> PcmFormat:
        return PcmFormat(self.rate, self.encoding)

    @property
    def full_prompt(self) -> str | None:
        """The prompt with the keywords joined after it (Whisper takes vocabulary as prompt text). Raises nothing."""
        return joined_prompt(self.prompt, self.keywords)

    def decoding(self) -> dict[str, Any]:
        """What the speech service's options() takes for this configuration. Raises nothing."""
        td = self.turn_detection
        out: dict[str, Any] = {"language": self.language, "languages": tuple(self.languages),
                               "prompt": self.full_prompt, "vad": td is not None,
                               "noise_reduction": self.noise_reduction, "logprobs": self.logprobs,
                               "agreement": DELAY_DECODES[self.delay or "medium"]}
        if td is not None:
            out.update(vad_options(td.threshold, td.prefix_padding_ms, td.silence_duration_ms))
        return out

    # ---- updates ------------------------------------------------------------------------------
    def updated(self, session: Any, dialect: Dialect) -> "RealtimeConfig":
        """A copy with `session` (the update event's `session` object) applied. Raises ConfigError naming the
        first field it cannot honour."""
        if not isinstance(session, dict):
            raise ConfigError("`session` must be an object", "session")
        new = copy.deepcopy(self)
        if dialect == "ga" or "type" in session:
            new._apply_ga(session)
        else:
            new._apply_beta(session)
        if new.model != self.model and not new.turn_detection_set:  # the client left it to the model's default
            new.turn_detection = new.default_turn_detection()
        return new

    def _apply_beta(self, s: dict[str, Any]) -> None:
        known_fields(s, {"input_audio_format", "input_audio_transcription", "turn_detection", "include", "modalities",
                   "input_audio_noise_reduction", "client_secret"}, "session")
        if "input_audio_format" in s and s["input_audio_format"] is not None:
            self.encoding, self.rate = beta_format(s["input_audio_format"], "session.input_audio_format")
        if s.get("modalities") not in (None, ["text"]):
            raise ConfigError("a transcription session answers with text only", "session.modalities")
        if s.get("client_secret") is not None:
            raise ConfigError("a client secret is minted by POST /v1/realtime/transcription_sessions, not set by an "
                              "update", "session.client_secret")
        if "input_audio_noise_reduction" in s:
            self._noise_reduction(s["input_audio_noise_reduction"], "session.input_audio_noise_reduction")
        if "input_audio_transcription" in s:
            self._transcription(s["input_audio_transcription"], "session.input_audio_transcription")
        if "turn_detection" in s:
            self._turn_detection(s["turn_detection"], "session.turn_detection")
        if "include" in s:
            self._include(s["include"], "session.include")

    def _apply_ga(self, s: dict[str, Any]) -> None:
        known_fields(s, {"type", "audio", "include"}, "session")
        if s.get("type") != "transcription":
            raise ConfigError("only transcription sessions are served: session.type must be 'transcription'",
                              "session.type")
        audio = s.get("audio")
        if audio is not None:
            if not isinstance(audio, dict):
                raise ConfigError("`audio` must be an object", "session.audio")
            known_fields(audio, {"input"}, "session.audio")
            inp = audio.get("input")
            if inp is not None:
                if not isinstance(inp, dict):
                    raise ConfigError("`input` must be an object", "session.audio.input")
                known_fields(inp, {"format", "transcription", "turn_detection", "noise_reduction"},
                             "session.audio.input")
                if inp.get("format") is not None:
                    self.encoding, self.rate = ga_format(inp["format"], "session.audio.input.format")
                if "noise_reduction" in inp:
                    self._noise_reduction(inp["noise_reduction"], "session.audio.input.noise_reduction")
                if "transcription" in inp:
                    self._transcription(inp["transcription"], "session.audio.input.transcription")
                if "turn_detection" in inp:
                    self._turn_detection(inp["turn_detection"], "session.audio.input.turn_detection")
        if "include" in s:
            self._include(s["include"], "session.include")

    def _noise_reduction(self, nr: Any, where: str) -> None:
        if nr is None:
            self.noise_reduction = None
            return
        if not isinstance(nr, dict):
            raise ConfigError("`noise_reduction` must be an object or null", where)
        known_fields(nr, {"type"}, where)
        kind = nr.get("type")
        if kind not in NOISE_KINDS:
            raise ConfigError(f"noise reduction type {kind!r} is not available; use {' or '.join(NOISE_KINDS)} "
                              "(null turns it off)", f"{where}.type")
        self.noise_reduction = kind

    def _transcription(self, t: Any, where: str) -> None:
        if t is None:
            raise ConfigError("this session only transcribes; transcription cannot be turned off", where)
        if not isinstance(t, dict):
            raise ConfigError("`transcription` must be an object", where)
        known_fields(t, {"model", "language", "prompt", "keywords", "languages", "delay"}, where)
        for key in ("model", "language", "prompt"):
            if key in t and t[key] is not None and not isinstance(t[key], str):
                raise ConfigError(f"{key} must be a string", f"{where}.{key}")
        if "model" in t:
            self.model = t["model"] or None
        if "language" in t:
            self.language = t["language"] or None
        if "prompt" in t:
            self.prompt = t["prompt"] or None
        if t.get("keywords") is not None:
            words = t["keywords"]
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise ConfigError("keywords must be a list of strings", f"{where}.keywords")
            self.keywords = list(words)
        if "languages" in t:  # null: none (the speech may be in any language)
            languages = t["languages"] or []
            if not isinstance(languages, list) or not all(isinstance(x, str) for x in languages):
                raise ConfigError("languages must be a list of strings", f"{where}.languages")
            self.languages = list(languages)
        if "delay" in t:  # null: the default
            if t["delay"] is not None and not (isinstance(t["delay"], str) and t["delay"] in DELAY_DECODES):
                raise ConfigError(f"delay must be one of {', '.join(DELAY_DECODES)}", f"{where}.delay")
            self.delay = t["delay"]

    def _turn_detection(self, td: Any, where: str) -> None:
        self.turn_detection_set = True
        if td is None:
            self.turn_detection = None
            return
        if not isinstance(td, dict):
            raise ConfigError("`turn_detection` must be an object or null", where)
        known_fields(td, {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
                          "interrupt_response", "idle_timeout_ms", "eagerness"}, where)
        current = self.turn_detection
        kind = td.get("type") or (current.type if current is not None else "server_vad")
        if kind not in ("server_vad", "semantic_vad"):
            raise ConfigError(f"turn detection {kind!r} is not available; use server_vad or semantic_vad",
                              f"{where}.type")
        for key in ("create_response", "interrupt_response"):
            if td.get(key):
                raise ConfigError(f"{key} is not available for transcription sessions", f"{where}.{key}")
        if td.get("idle_timeout_ms") is not None:
            raise ConfigError("idle_timeout_ms is not available", f"{where}.idle_timeout_ms")
        # a change of type starts from its defaults: one type's settings mean nothing to the other
        new = copy.copy(current) if current is not None and current.type == kind else TurnDetection(type=kind)
        if kind == "semantic_vad":
            self.turn_detection = _semantic(td, new, where)
            return
        if td.get("eagerness") is not None:
            raise ConfigError("eagerness is semantic_vad's; server_vad takes silence_duration_ms",
                              f"{where}.eagerness")
        if td.get("threshold") is not None:
            value = td["threshold"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ConfigError("threshold must be a number in 0.0–1.0", f"{where}.threshold")
            new.threshold = float(value)
        for key, low, high in (("prefix_padding_ms", 0, 2000), ("silence_duration_ms", 30, 10_000)):
            if td.get(key) is not None:
                value = td[key]
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                    raise ConfigError(f"{key} must be an integer in {low}–{high}", f"{where}.{key}")
                setattr(new, key, value)
        self.turn_detection = new

    def _include(self, include: Any, where: str) -> None:
        if include is None:
            self.tentative = self.logprobs = False
            return
        if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
            raise ConfigError("include must be a list of strings", where)
        unknown = [x for x in include if x not in INCLUDES]
        if unknown:
            raise ConfigError(f"{unknown[0]!r} cannot be included (available: {', '.join(INCLUDES)})", where)
        self.tentative, self.logprobs = TENTATIVE in include, LOGPROBS in include

    # ---- rendering ----------------------------------------------------------------------------
    def session_object(self, dialect: Dialect, session_id: str, served_model: str) -> dict[str, Any]:
        """The session object of a `.created` / `.updated` event. Raises nothing."""
        td = self.turn_detection
        turn: dict[str, Any] | None = None
        if td is not None and td.type == "semantic_vad":
            turn = {"type": "semantic_vad", "eagerness": td.eagerness}
        elif td is not None:
            turn = {"type": "server_vad", "threshold": td.threshold, "prefix_padding_ms": td.prefix_padding_ms,
                    "silence_duration_ms": td.silence_duration_ms}
        transcription: dict[str, Any] = {"model": self.model or served_model, "language": self.language,
                                         "prompt": self.prompt}
        if self.delay is not None:
            transcription["delay"] = self.delay
        include = [x for x, on in ((LOGPROBS, self.logprobs), (TENTATIVE, self.tentative)) if on] or None
        noise = {"type": self.noise_reduction} if self.noise_reduction is not None else None
        if dialect == "beta":
            return {"id": session_id, "object": "realtime.transcription_session",
                    "input_audio_format": shown_beta(self.encoding, self.rate),
                    "input_audio_transcription": transcription, "turn_detection": turn, "modalities": ["text"],
                    "input_audio_noise_reduction": noise, "include": include}
        if self.keywords:
            transcription["keywords"] = list(self.keywords)
        if self.languages:
            transcription["languages"] = list(self.languages)
        return {"type": "transcription", "id": session_id, "object": "realtime.transcription_session",
                "audio": {"input": {"format": shown_ga(self.encoding, self.rate), "transcription": transcription,
                                    "turn_detection": turn, "noise_reduction": noise}},
                "include": include}


def _semantic(td: dict[str, Any], new: TurnDetection, where: str) -> TurnDetection:
    """semantic_vad as server VAD: its eagerness sets the pause that ends a turn. Raises ConfigError naming a
    server_vad field sent with it or an unknown eagerness."""
    for key in sorted(set(td) - _SEMANTIC_FIELDS):
        if td[key] is not None:
            raise ConfigError(f"{key} is server_vad's; semantic_vad takes eagerness", f"{where}.{key}")
    eagerness = td.get("eagerness")
    if eagerness is not None:
        if eagerness not in EAGERNESS_SILENCE_MS:
            raise ConfigError(f"eagerness must be one of {', '.join(EAGERNESS_SILENCE_MS)}", f"{where}.eagerness")
        new.eagerness = eagerness
    new.silence_duration_ms = EAGERNESS_SILENCE_MS[new.eagerness]
    return new
