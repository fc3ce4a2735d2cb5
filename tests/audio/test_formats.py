"""audio/formats.py: golden renderings of one transcript."""

from __future__ import annotations

import dataclasses
import re

import pytest

from audio.formats import render, timestamp, token_usage
from audio.transcript import Segment, TokenCounts, Transcript, Word

T = Transcript(
    text=" Hello there. General Kenobi.", language="en", duration=3725.5, task="transcribe",
    segments=[
        Segment(0, 0, 0.0, 1.5, " Hello there.", [1, 2], words=[Word(" Hello", 0.0, 0.7, 0.9), Word(" there.", 0.7, 1.5, 0.8)]),
        Segment(1, 0, 3661.25, 3662.004, " General Kenobi.", [3], words=[Word(" General", 3661.25, 3661.6, 0.7)]),
        Segment(2, 0, 3663.0, 3663.0, "", []),
    ],
)


def test_timestamp_formats() -> None:
    assert timestamp(0) == "00:00:00.000"
    assert timestamp(3661.2506, decimal=",") == "01:01:01,251"
    with pytest.raises(ValueError):
        timestamp(-1)


def test_srt_golden() -> None:
    assert render(T, "srt") == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
        "2\n01:01:01,250 --> 01:01:02,004\nGeneral Kenobi.\n"
    )


def test_vtt_golden_and_well_formed() -> None:
    vtt = render(T, "vtt")
    assert vtt == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
                   "01:01:01.250 --> 01:01:02.004\nGeneral Kenobi.\n")
    cue = re.compile(r"^\d{2}:\d{2}:\d{2}\.\d{3} --> \d{2}:\d{2}:\d{2}\.\d{3}$")
    assert all(cue.match(line) for line in vtt.splitlines() if "-->" in line)


def test_text_and_json() -> None:
    assert render(T, "text") == "Hello there. General Kenobi.\n"
    # OpenAI's text has no leading space (its segments keep theirs); usage is the audio's seconds
    assert render(T, "json") == {"text": "Hello there. General Kenobi.", "usage": {"type": "duration", "seconds": 3725.5}}


def test_verbose_json_fields() -> None:
    body = render(T, "verbose_json", words=True)
    assert isinstance(body, dict)
    assert {k: body[k] for k in ("task", "language", "duration", "text", "usage")} == {
        "task": "transcribe", "language": "english", "duration": 3725.5, "text": "Hello there. General Kenobi.",
        "usage": {"type": "duration", "seconds": 3725.5}}
    seg = body["segments"][0]
    assert set(seg) == {"id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
                        "compression_ratio", "no_speech_prob"}
    assert [w["word"] for w in body["words"]] == ["Hello", "there.", "General"]  # no leading space, as OpenAI's
    assert "words" not in render(T, "verbose_json")


def test_a_translation_is_in_english_whatever_was_spoken() -> None:
    """OpenAI: a translation's `language` is always english, the language of its text."""
    spoken_german = Transcript(text=" Hello.", language="de", duration=1.0, task="translate")
    body = render(spoken_german, "verbose_json")
    assert isinstance(body, dict) and body["task"] == "translate" and body["language"] == "english"
    transcribed = render(Transcript(text=" Hallo.", language="de", duration=1.0), "verbose_json")
    assert isinstance(transcribed, dict) and transcribed["language"] == "german"


def test_token_usage_is_openais_from_the_counts_and_none_without_them() -> None:
    counted = dataclasses.replace(T, tokens=TokenCounts(prompt=5, audio=150, output=7))
    assert token_usage(counted) == {"type": "tokens", "input_tokens": 155,
                                    "input_token_details": {"text_tokens": 5, "audio_tokens": 150},
                                    "output_tokens": 7, "total_tokens": 162}
    assert token_usage(T) is None
    assert token_usage(counted.tokens) == token_usage(counted)  # the counts alone: a Realtime transcript's


def test_unknown_format() -> None:
    with pytest.raises(ValueError):
        render(T, "docx")


ODD = Transcript(text=" a --> b", language="en", duration=4.0, task="transcribe", segments=[
    Segment(0, 0, 0.0, 1.0, " a --> b", []),
    Segment(1, 0, 1.0, 2.0, " one\n\n  \r\ntwo\rthree", []),
    Segment(2, 0, 2.0, 3.0, " <b>Tom & Jerry</b> > 1", []),
    Segment(3, 0, 3.0, 4.0, " \n \n", []),
])


def test_srt_cue_text_cannot_break_its_cue() -> None:
    # "-->" read as a timing line and a blank line ended the cue: openai-whisper's writers make the arrow "->"
    assert render(ODD, "srt") == ("1\n00:00:00,000 --> 00:00:01,000\na -> b\n\n"
                                  "2\n00:00:01,000 --> 00:00:02,000\none\ntwo\nthree\n\n"
                                  "3\n00:00:02,000 --> 00:00:03,000\n<b>Tom & Jerry</b> > 1\n")


def test_vtt_cue_text_is_escaped_as_webvtt_requires() -> None:
    # & and < start WebVTT escapes and tags: a transcript's own are text
    assert render(ODD, "vtt") == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\na -&gt; b\n\n"
                                  "00:00:01.000 --> 00:00:02.000\none\ntwo\nthree\n\n"
                                  "00:00:02.000 --> 00:00:03.000\n&lt;b&gt;Tom &amp; Jerry&lt;/b&gt; &gt; 1\n")
