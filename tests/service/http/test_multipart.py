"""service/http/multipart.py: a form's file fields are files with or without a filename, its text fields text,
and a text field that is not UTF-8 a 400 naming it."""

from __future__ import annotations

from typing import AsyncGenerator

import pytest
from litestar.datastructures import UploadFile
from litestar.exceptions import ClientException

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


def raw_part(head: bytes, body: bytes) -> bytes:
    return b"--" + BOUNDARY + b"\r\n" + head + b"\r\n\r\n" + body + b"\r\n"


async def test_a_filename_that_is_not_utf8_is_read_as_latin1() -> None:
    # curl sends a Latin-1 name's bytes as they are: it was "Invalid multipart/form-data", the upload refused
    latin1 = raw_part(b'Content-Disposition: form-data; name="file"; filename="caf\xe9.wav"', b"RIFF1")
    utf8 = raw_part('Content-Disposition: form-data; name="t\u00e9"; filename="\u00e9t\u00e9.wav"'.encode(), b"RIFF2")
    form = await parse_form(chunks(latin1, utf8, part("model", b"whisper-1")), BOUNDARY, {"file"}, 100)
    assert form["file"].filename == "caf\u00e9.wav" and await form["file"].read() == b"RIFF1"
    assert form["t\u00e9"].filename == "\u00e9t\u00e9.wav" and form["model"] == "whisper-1"
    # a UTF-8 field name beside a Latin-1 filename in one header: each read alone
    both = raw_part('Content-Disposition: form-data; name="\u00e9"; filename="'.encode() + b'\xe9.txt"', b"x")
    assert (await parse_form(chunks(both), BOUNDARY, set(), 100))["\u00e9"].filename == "\u00e9.txt"


@pytest.mark.parametrize("head, param, words", [
    (b'Content-Disposition: form-data; name="fil\xe9"', None, "A part's name is not UTF-8 (b'fil\\xe9')"),
    (b'Content-Disposition: form-data; name="file"\r\nContent-Type: audio/w\xe9v', "file",
     "Non-UTF-8 header in part `file`: its Content-Type"),
])
async def test_a_part_name_or_content_type_that_is_not_utf8_is_refused_saying_so(head: bytes, param: str | None,
                                                                                  words: str) -> None:
    with pytest.raises(APIError) as caught:
        await parse_form(chunks(raw_part(head, b"RIFF")), BOUNDARY, {"file"}, 100)
    assert caught.value.status == 400 and caught.value.param == param and caught.value.code == "invalid_encoding"
    assert caught.value.message.startswith(words), caught.value.message


@pytest.mark.parametrize("charset", ["punycode", "unicode_escape", "rot13", "base64", "no-such-charset"])
async def test_a_charset_that_is_no_text_encoding_is_refused_naming_the_part(charset: str) -> None:
    # punycode's decoder raised past the handler: a 500 with a traceback; any codec was taken as a charset
    prompt = part("prompt", b"abc-9999999", content_type=f"text/plain; charset={charset}")
    form = (part("file", b"RIFF", filename="a.wav"), prompt)
    with pytest.raises(APIError) as caught:
        await parse_form(chunks(*form), BOUNDARY, {"file"}, 100)
    assert caught.value.status == 400 and caught.value.param == "prompt" and caught.value.code == "invalid_encoding"


@pytest.mark.parametrize("charset, body", [("ISO-8859-1", b"caf\xe9"), ("windows-1252", b"caf\xe9"),
                                           ("utf-16", "café".encode("utf-16")), ("us-ascii", b"cafe")])
async def test_a_text_encoding_a_client_names_is_read(charset: str, body: bytes) -> None:
    form = await parse_form(chunks(part("prompt", body, content_type=f"text/plain; charset={charset}")), BOUNDARY,
                            set(), 100)
    assert form["prompt"] in ("caf\u00e9", "cafe")


async def test_an_odd_utf16_text_part_is_refused_naming_it() -> None:
    with pytest.raises(APIError) as caught:
        await parse_form(chunks(part("prompt", b"\xff\xfea", content_type="text/plain; charset=utf-16")), BOUNDARY,
                         set(), 100)
    assert caught.value.status == 400 and caught.value.param == "prompt"


async def test_a_malformed_form_says_what_the_parser_found() -> None:
    with pytest.raises(ClientException) as caught:
        await parse_form(chunks(raw_part(b"Content-Disposition form-data", b"x")), BOUNDARY, set(), 100)
    assert caught.value.detail == "Invalid multipart/form-data: Malformed segment header"
