"""service/speech/realtime_format.py: what a session object shows as its input format, in either dialect, is taken
back unchanged — a beta session at 16 kHz showed `pcm16` (echoed: 24 kHz, audio read 1.5x fast) and one in f32le
showed `f32le` (echoed: refused)."""

from __future__ import annotations

from typing import Any

import pytest

from audio.pcm import PcmFormat
from service.speech.realtime_config import ConfigError, Dialect, RealtimeConfig

FORMATS = [PcmFormat(16000, "f32le"), PcmFormat(16000, "s16le"), PcmFormat(24000, "s16le"), PcmFormat(48000, "s16be"),
           PcmFormat(8000, "ulaw"), PcmFormat(16000, "ulaw"), PcmFormat(8000, "alaw")]


def configured(fmt: PcmFormat) -> RealtimeConfig:
    # as /v1/audio/live's query sets it (?encoding=&rate=), or a GA update naming the format
    ga = {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": fmt.rate,
                                                                  "encoding": fmt.encoding}}}}
    config = RealtimeConfig.initial().updated(ga, "ga")
    assert config.pcm_format == fmt
    return config


def shown(config: RealtimeConfig, dialect: Dialect) -> dict[str, Any]:
    """The session object less what only the server sets (its id and object)."""
    session = config.session_object(dialect, "sess_1", "tiny.en")
    return {k: v for k, v in session.items() if k not in ("id", "object")}


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f.encoding}@{f.rate}")
@pytest.mark.parametrize("dialect", ["beta", "ga"])
def test_the_session_object_echoed_back_changes_nothing(fmt: PcmFormat, dialect: Dialect) -> None:
    config = configured(fmt)
    again = config.updated(shown(config, dialect), dialect)
    assert again.pcm_format == fmt
    assert shown(again, dialect) == shown(config, dialect)
    # a fresh session (/v1/realtime's 24 kHz pcm16) given it takes the format too
    assert RealtimeConfig.initial().updated(shown(config, dialect), dialect).pcm_format == fmt


@pytest.mark.parametrize("fmt, beta", [(PcmFormat(24000, "s16le"), "pcm16"), (PcmFormat(8000, "ulaw"), "g711_ulaw"),
                                       (PcmFormat(8000, "alaw"), "g711_alaw"),
                                       (PcmFormat(16000, "s16le"), "audio/pcm;rate=16000;encoding=s16le"),
                                       (PcmFormat(16000, "f32le"), "audio/pcm;rate=16000;encoding=f32le"),
                                       (PcmFormat(16000, "ulaw"), "audio/pcm;rate=16000;encoding=ulaw")])
def test_beta_names_a_format_it_has_a_name_for_and_writes_any_other_as_a_content_type(fmt: PcmFormat,
                                                                                       beta: str) -> None:
    assert configured(fmt).session_object("beta", "sess_1", "tiny.en")["input_audio_format"] == beta


@pytest.mark.parametrize("value, says", [("g722", "is not supported"), ("audio/pcm;rate=96000", "rate must be"),
                                         ("audio/pcm;rate=fast", "rate must be"), ("audio/pcm;encoding=mp3",
                                                                                   "encoding must be"),
                                         ("audio/pcmu;rate=16000", "8000 Hz"), ("audio/pcm;bits=16", "unknown field"),
                                         ("audio/flac", "not supported"), (16000, "is not supported"),
                                         ("audio/pcm;rate=16000;rate=8000", "'rate' is given twice"),  # the last won
                                         ("audio/pcm;rate=٤٤١٠٠", "rate must be"),  # read as 44100
                                         ("audio/pcm;rate=44_100", "rate must be")])
def test_a_beta_format_that_cannot_be_honoured_is_refused_naming_the_field(value: Any, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RealtimeConfig.initial().updated({"input_audio_format": value}, "beta")
    assert refused.value.param == "session.input_audio_format" and says in refused.value.message


def test_a_beta_content_type_without_a_rate_or_encoding_is_what_ga_s_format_means() -> None:
    # GA's audio/pcm: s16le at 24 kHz unless named (not the HTTP routes' f32le at 16 kHz)
    assert RealtimeConfig.initial().updated({"input_audio_format": "audio/pcm"}, "beta").pcm_format == \
        PcmFormat(24000, "s16le")


@pytest.mark.parametrize("value", ["audio/pcm;rate=16000;encoding=s16le;", 'audio/pcm;rate="16000";encoding=s16le',
                                   "Audio/PCM; Rate=16000; Encoding=S16LE"])
def test_a_beta_content_type_is_read_as_the_http_routes_read_one(value: str) -> None:
    # A trailing `;` was refused as "unknown field ''" and a quoted rate as not a number; parse_pcm_content_type
    # (the HTTP routes' Content-Type) takes both.
    assert RealtimeConfig.initial().updated({"input_audio_format": value}, "beta").pcm_format == \
        PcmFormat(16000, "s16le")
