"""A Realtime transcription session's configuration (service/speech/realtime_config.py): the turn detection a session
has while its client has not set one follows its transcription model — none for OpenAI's realtime-only models."""

from __future__ import annotations

from typing import Any

import pytest

from audio.pcm import PcmFormat
from service.speech.realtime_config import REALTIME_ONLY_MODELS, ConfigError, RealtimeConfig

# LiveKit Agents' session.update for gpt-realtime-whisper / gpt-live-transcribe (livekit-plugins-openai stt.py): it
# leaves turn_detection out, because these models "reject turn_detection and emit no speech_started/stopped, so the
# client commits the buffer to close a segment"
def livekit(model: str) -> dict[str, Any]:
    return {"type": "transcription", "audio": {"input": {"format": {"rate": 24000, "type": "audio/pcm"},
                                                         "transcription": {"language": "en", "model": model}}}}


def beta(model: str) -> dict[str, Any]:
    return {"input_audio_format": "pcm16", "input_audio_transcription": {"language": "en", "model": model}}


def turn(config: RealtimeConfig, dialect: str) -> Any:
    shown = config.session_object(dialect, "sess_1", "tiny.en")  # type: ignore[arg-type]
    return shown["turn_detection"] if dialect == "beta" else shown["audio"]["input"]["turn_detection"]


@pytest.mark.parametrize("model", sorted(REALTIME_ONLY_MODELS))
@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_a_realtime_only_model_named_in_an_update_has_no_turn_detection(model: str, dialect: str) -> None:
    update = livekit(model) if dialect == "ga" else beta(model)
    config = RealtimeConfig.initial().updated(update, dialect)  # type: ignore[arg-type]
    assert config.turn_detection is None and turn(config, dialect) is None
    assert config.decoding()["vad"] is False  # the session itself: only the client's commits end an item


@pytest.mark.parametrize("model", sorted(REALTIME_ONLY_MODELS))
def test_a_realtime_only_model_named_in_the_url_starts_with_no_turn_detection(model: str) -> None:
    assert RealtimeConfig.initial(model=model).turn_detection is None
    assert RealtimeConfig.initial(model="gpt-4o-transcribe").turn_detection is not None


def test_turn_detection_asked_for_is_served_for_a_realtime_only_model() -> None:
    # OpenAI refuses it; Whisper's VAD serves any id, so a client that asks gets it rather than a failed session
    update = livekit("gpt-live-transcribe")
    update["audio"]["input"]["turn_detection"] = {"type": "server_vad", "silence_duration_ms": 700}
    config = RealtimeConfig.initial().updated(update, "ga")
    assert turn(config, "ga") == {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                  "silence_duration_ms": 700}
    # set once, it stays through a later change of model
    config = config.updated(livekit("gpt-realtime-whisper"), "ga")
    assert config.turn_detection is not None and config.turn_detection.silence_duration_ms == 700


def test_the_default_follows_the_model_until_the_client_sets_it() -> None:
    config = RealtimeConfig.initial(model="gpt-realtime-whisper").updated(livekit("gpt-4o-mini-transcribe"), "ga")
    assert turn(config, "ga") == {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                  "silence_duration_ms": 500}
    # a server run with --no-vad has none for any model
    assert RealtimeConfig.initial(vad=False).updated(livekit("whisper-1"), "ga").turn_detection is None
    # turned off by the client, it stays off for a model that would have it on
    off = RealtimeConfig.initial().updated({"turn_detection": None}, "beta")
    assert off.updated(beta("gpt-4o-transcribe"), "beta").turn_detection is None


@pytest.mark.parametrize("delay, decodes", [("minimal", 1), ("low", 2), ("medium", 2), ("high", 3), ("xhigh", 4)])
@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_delay_is_how_many_decodes_agree_and_is_shown_back(delay: str, decodes: int, dialect: str) -> None:
    # openai-python's AudioTranscription.delay, "how long the model waits before emitting transcription text"
    update = livekit("gpt-realtime-whisper") if dialect == "ga" else beta("gpt-realtime-whisper")
    where = update["audio"]["input"] if dialect == "ga" else update
    where["transcription" if dialect == "ga" else "input_audio_transcription"]["delay"] = delay
    config = RealtimeConfig.initial().updated(update, dialect)  # type: ignore[arg-type]
    assert config.decoding()["agreement"] == decodes
    shown = config.session_object(dialect, "sess_1", "tiny.en")  # type: ignore[arg-type]
    assert (shown["audio"]["input"]["transcription"] if dialect == "ga" else
            shown["input_audio_transcription"])["delay"] == delay
    # null: back to the default, two, and no longer shown
    where["transcription" if dialect == "ga" else "input_audio_transcription"]["delay"] = None
    config = config.updated(update, dialect)  # type: ignore[arg-type]
    assert config.decoding()["agreement"] == 2 and config.delay is None


@pytest.mark.parametrize("delay", ["soon", 2, ["low"]])
def test_a_delay_that_is_not_openais_is_refused_by_name(delay: Any) -> None:
    from service.speech.realtime_config import ConfigError

    update = livekit("gpt-realtime-whisper")
    update["audio"]["input"]["transcription"]["delay"] = delay
    with pytest.raises(ConfigError) as refused:
        RealtimeConfig.initial().updated(update, "ga")
    assert refused.value.param == "session.audio.input.transcription.delay" and "xhigh" in refused.value.message


def ga_format(fmt: dict[str, Any]) -> dict[str, Any]:
    return {"type": "transcription", "audio": {"input": {"format": fmt}}}


@pytest.mark.parametrize("fmt, read_as", [
    ({"type": "audio/pcm", "rate": 48000, "encoding": "f32le"}, PcmFormat(48000, "f32le")),  # /v1/audio/live's
    ({"type": "audio/pcm", "rate": 16000, "encoding": "s16be"}, PcmFormat(16000, "s16be")),
    ({"type": "audio/pcm", "rate": 24000, "encoding": "s16le"}, PcmFormat(24000, "s16le")),
    ({"type": "audio/pcm", "rate": 16000, "encoding": "alaw"}, PcmFormat(16000, "alaw")),  # ?encoding=alaw&rate=
    ({"type": "audio/pcm", "encoding": "ulaw"}, PcmFormat(8000, "ulaw")),  # G.711's own rate unless given
    ({"type": "audio/pcmu", "encoding": "ulaw"}, PcmFormat(8000, "ulaw")),
])
def test_a_formats_encoding_is_taken_and_shown_back(fmt: dict[str, Any], read_as: PcmFormat) -> None:
    # the format /v1/audio/live's session.created announces, echoed in session.update, was "unknown field 'encoding'"
    config = RealtimeConfig.initial().updated(ga_format(fmt), "ga")
    assert config.pcm_format == read_as
    shown = config.session_object("ga", "sess_1", "tiny.en")["audio"]["input"]["format"]
    assert RealtimeConfig.initial().updated(ga_format(shown), "ga").pcm_format == read_as  # what it shows, it takes
    if fmt["type"] == "audio/pcm" and read_as.encoding != "s16le" and read_as.rate != 8000:
        assert shown == {"type": "audio/pcm", "rate": read_as.rate, "encoding": read_as.encoding}
    assert config.session_object("beta", "sess_1", "tiny.en")["input_audio_format"]  # beta shows it too


@pytest.mark.parametrize("fmt", [{"type": "audio/pcm", "encoding": "mp3"}, {"type": "audio/pcmu", "encoding": "alaw"},
                                 {"type": "audio/pcma", "encoding": "f32le"}, {"type": "audio/pcm", "encoding": 16}])
def test_an_encoding_that_cannot_be_honoured_is_refused_by_name(fmt: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as refused:
        RealtimeConfig.initial().updated(ga_format(fmt), "ga")
    assert refused.value.param == "session.audio.input.format.encoding" and "encoding must be" in refused.value.message
