"""audio/pcm_parameters.py: a raw-PCM content type's parameters, read one way by the HTTP routes and a beta Realtime
session's input_audio_format (which refused a trailing `;` and a quoted rate, and took a repeated one's last)."""

from __future__ import annotations

import pytest

from audio.errors import AudioInputError
from audio.pcm_parameters import split_content_type, whole_number


@pytest.mark.parametrize("value, split", [
    ("audio/pcm", ("audio/pcm", {})),
    ("audio/pcm;rate=16000;encoding=s16le;", ("audio/pcm", {"rate": "16000", "encoding": "s16le"})),
    ('Audio/PCM; Rate="16000" ; encoding=S16LE', ("audio/pcm", {"rate": "16000", "encoding": "s16le"})),
    ("audio/pcm;;rate=8000", ("audio/pcm", {"rate": "8000"})),
])
def test_a_content_type_is_split_into_its_type_and_parameters(value: str, split: tuple[str, dict[str, str]]) -> None:
    assert split_content_type(value) == split


def test_a_parameter_given_twice_is_refused_by_name() -> None:
    with pytest.raises(AudioInputError) as refused:
        split_content_type("audio/pcm;rate=16000;RATE=8000")
    assert refused.value.param == "rate" and refused.value.code == "invalid_content_type"
    assert "'rate' is given twice" in refused.value.message


@pytest.mark.parametrize("text, number", [("16000", 16000), ("0", 0), ("٤٤١٠٠", None), ("+8000", None),
                                          ("8_000", None), ("", None), ("-1", None), ("16000.0", None),
                                          ("9" * 20_000, None)])
def test_a_whole_number_is_ascii_digits(text: str, number: int | None) -> None:
    assert whole_number(text) == number
