"""service/speech/socket_errors.py: what a live socket tells its client when something goes wrong."""

from __future__ import annotations

import base64

import pytest

from audio.errors import SessionLimit
from service.http.errors import APIError
from service.speech.realtime_config import ConfigError
from service.speech.socket_errors import as_api_error, base64_audio, close_code, shutting_down


def test_close_codes_say_whether_to_come_back() -> None:
    assert close_code(APIError(429, "full")) == 1013 and close_code(shutting_down()) == 1013  # try again later
    assert close_code(APIError(400, "bad")) == 1008  # the client's fault
    assert close_code(APIError(500, "boom")) == 1011


@pytest.mark.parametrize("audio, code", [(123, "invalid_value"), ("%%%", "invalid_base64")])
def test_audio_that_is_not_base64_names_the_field(audio: object, code: str) -> None:
    with pytest.raises(APIError) as err:
        base64_audio(audio)
    assert err.value.param == "audio" and err.value.code == code
    assert base64_audio(base64.b64encode(b"\x01\x02").decode()) == b"\x01\x02"


def test_known_errors_keep_their_status_and_an_unknown_one_is_a_server_error(caplog: pytest.LogCaptureFixture) -> None:
    refused = as_api_error(ConfigError("no such language", "session.audio.input.transcription.language"))
    assert refused.status == 400 and refused.param == "session.audio.input.transcription.language"
    assert as_api_error(SessionLimit("too many open audio sessions")).status == 429
    fault = as_api_error(RuntimeError("boom"))
    assert fault.status == 500 and "boom" not in fault.message
    assert "unhandled error" in caplog.text
