"""service/http/multipart.py: a form's file fields are files with or without a filename, its text fields text,
and a text field that is not UTF-8 a 400 naming it."""

from __future__ import annotations

from typing import AsyncGenerator

import pytest
from litestar.datastructures import UploadFile

from service.http.errors import APIError
from service.http.multipart import parse_form

pytestmark = pytest.mark.anyio
BOUNDARY = b"b0undary"


def part(name: str, body: bytes, *, filename: str | None = None, content_type: str | None = None) -> bytes:
    disposition = f'Content-Disposition: form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = disposition + (f"\r\nContent-Type: {content_type}" if content_type else "")
    return b"--" + BOUNDARY + b"\r\n" + head.encode() + b"\r\n\r\n" + body + b"\r\n"


async def chunks(*parts: bytes) -> AsyncGenerator[bytes, None]:
    body = b"".join(parts) + b"--" + BOUNDARY + b"--\r\n"
    for i in range(0, len(body), 7):  # small pieces: a part's header and data split across chunks
        yield body[i:i + 7]


async def test_a_file_field_without_a_filename_is_a_file() -> None:
    audio = b"RIFF\xff\xfe\x00\x80WAVE"
    form = await parse_form(chunks(part("file", audio, content_type="audio/wav"), part("model", b"whisper-1"),
                                   part("other", b"\x00\x01", filename="x.bin")), BOUNDARY, {"file"}, 100)
    upload = form["file"]
    assert isinstance(upload, UploadFile) and await upload.read() == audio and upload.content_type == "audio/wav"
    assert form["model"] == "whisper-1" and isinstance(form["other"], UploadFile)


async def test_a_text_field_that_is_not_utf8_is_refused_naming_it() -> None:
    with pytest.raises(APIError) as caught:
        await parse_form(chunks(part("file", b"\xff", filename="a.wav"), part("prompt", b"\xff\xfe")), BOUNDARY,
                         {"file"}, 100)
    assert caught.value.status == 400 and caught.value.param == "prompt"


async def test_a_form_of_too_many_parts_is_a_413_naming_the_limit() -> None:
    with pytest.raises(APIError) as caught:
        await parse_form(chunks(part("a", b"1"), part("b", b"2"), part("c", b"3")), BOUNDARY, set(), 2)
    assert caught.value.status == 413 and "more than 2 parts" in caught.value.message


async def test_a_file_field_sent_twice_is_refused_naming_it() -> None:
    files = [part("file", b"RIFF1", filename="a.wav"), part("file", b"RIFF2", filename="b.wav")]
    with pytest.raises(APIError) as caught:
        await parse_form(chunks(*files, part("model", b"whisper-1")), BOUNDARY, {"file"}, 100)
    assert caught.value.status == 400 and caught.value.param == "file" and "2 `file` parts" in caught.value.message
