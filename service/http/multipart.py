"""A multipart form whose file parts are files even without a filename: the openai SDK sends
`file=(None, data, "audio/wav")` so, and Litestar reads such a part as text (undecodable audio: a 400 naming
nothing). `read_file_parts` is a route's `before_request`: it parses the form as Litestar does, but a part named
as one of the route's file fields becomes an UploadFile whatever its disposition says, and a text part that is not
UTF-8 is refused naming its field. Litestar's body extractor then takes the parsed form as its own.

Part headers are UTF-8, but curl sends a filename's bytes as they are (a Latin-1 `café.wav`): a filename that is
not UTF-8 is read as Latin-1 (the server never needs it: audio is told by its signature), a part name or
Content-Type that is not is a 400 saying so.
"""

from __future__ import annotations

import codecs
from collections import defaultdict
from typing import Any, AsyncGenerator, Awaitable, Callable

from litestar import Request
from litestar.datastructures import UploadFile
from litestar.enums import RequestEncodingType
from litestar.exceptions import ClientException
from litestar.types import Empty
from litestar.utils.compat import async_next
from litestar.utils.scope.state import ScopeState
from multipart import (  # type: ignore[import-untyped]
    MultipartSegment,
    ParserError,
    ParserLimitReached,
    PushMultipartParser,
)

from service.http.errors import APIError

__all__ = ["file_parts", "parse_form"]


def file_parts(*names: str) -> Callable[[Request[Any, Any, Any]], Awaitable[None]]:
    """A `before_request` hook that parses a multipart body with `names` read as files (see the module). Raises
    APIError 400 for a body that is not a form (naming the first file field) or a text field that is not UTF-8;
    ClientException (400) for a malformed form, as Litestar."""

    async def read_file_parts(request: Request[Any, Any, Any]) -> None:
        state = ScopeState.from_scope(request.scope)
        content_type, options = request.content_type
        # Litestar's own answers name nothing ("Invalid multipart/form-data"): Open WebUI's JSON upload mode sends
        # the audio base64 in JSON, and a page setting the header itself on fetch(FormData) drops the boundary.
        wanted = (f"This route takes a multipart/form-data body (the audio as a `{names[0]}` part, the options as "
                  "fields)")
        if content_type != RequestEncodingType.MULTI_PART:
            shown = f"a {content_type[:60]} body" if content_type else "a body without a Content-Type"
            raise APIError(400, f"{wanted}, not {shown}.", param=names[0], code="invalid_content_type")
        if not options.get("boundary"):
            raise APIError(400, f"{wanted}: its Content-Type names no boundary (let the client library set the header "
                                "for the form it builds).", param=names[0], code="invalid_content_type")
        if state.form is not Empty:
            return
        state.form = await parse_form(request.stream(), options["boundary"].encode(), set(names),
                                      request.app.multipart_form_part_limit)

    return read_file_parts


async def parse_form(stream: AsyncGenerator[bytes, None], boundary: bytes, files: set[str],
                     part_limit: int) -> dict[str, Any]:
    """Litestar's parse_multipart_form, parts named in `files` always UploadFiles. Raises APIError 400 (a text part
    that is not UTF-8 or names a charset that is no text encoding, a part name or Content-Type that is not UTF-8, or
    a file field sent twice, naming it), ClientException 400 (a malformed form), APIError 413 (more than
    `part_limit` parts)."""
    fields: defaultdict[str, list[Any]] = defaultdict(list)
    chunk = await async_next(stream, b"")
    if not chunk:
        return fields
    data: UploadFile | bytearray = bytearray()
    try:
        with _Utf8Headers(boundary, max_segment_count=part_limit) as parser:
            segment: MultipartSegment | None = None
            while not parser.closed:
                for part in parser.parse(chunk):
                    if isinstance(part, MultipartSegment):
                        segment = part
                        if segment.filename or segment.name in files:
                            data = UploadFile(content_type=segment.content_type or "application/octet-stream",
                                              filename=segment.filename or "", headers=dict(segment.headerlist))
                    elif part:
                        if isinstance(data, UploadFile):
                            await data.write(part)
                        else:
                            data.extend(part)
                    else:
                        if segment is None:
                            raise ClientException("Unexpected eof in multipart/form-data")
                        if isinstance(data, UploadFile):
                            await data.seek(0)
                            fields[segment.name].append(data)
                        else:
                            fields[segment.name].append(_text(data, segment))
                        data, segment = bytearray(), None
                chunk = await async_next(stream, b"")
    except ParserError as exc:
        await _close(data, fields)
        # the parser's reason ("Malformed segment header"), which Litestar's words left out
        reason = f": {exc.args[0]}" if exc.args and isinstance(exc.args[0], str) else ""
        raise ClientException(f"Invalid multipart/form-data{reason}") from exc
    except ParserLimitReached:
        await _close(data, fields)
        # Litestar's words were "Request Entity Too Large" with a 400: say which limit, as a 413 names a size
        raise APIError(413, f"the form has more than {part_limit} parts; at most {part_limit} are read (a list "
                            f"field such as keywords[] counts one part an entry)") from None
    except APIError:
        await _close(data, fields)
        raise
    for name in files:  # a second audio file would be dropped unsaid, or refused in a validator's words
        if len(fields.get(name, ())) > 1 and not name.endswith("]"):
            count = len(fields[name])
            await _close(bytearray(), fields)
            raise APIError(400, f"The form has {count} `{name}` parts; send one.", param=name, code="invalid_value")
    return {k: v if len(v) > 1 else v[0] for k, v in fields.items()}


# The charsets a part may name (by codecs' canonical name): Unicode's and the WHATWG Encoding Standard's legacy ones.
# Python takes any codec, punycode and unicode_escape included (a 500 from inside it), rot13 not even bytes → text.
_TEXT_CHARSETS = frozenset({
    "utf-8", "utf-8-sig", "ascii", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be",
    *(f"iso8859-{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15, 16)), *(f"cp{n}" for n in range(1250, 1259)),
    "cp874", "cp866", "koi8-r", "koi8-u", "mac-roman", "mac-cyrillic", "gbk", "gb2312", "gb18030", "big5",
    "shift_jis", "euc_jp", "iso2022_jp", "euc_kr"})


def _text(data: bytearray, segment: MultipartSegment) -> str:
    charset, name = segment.charset or "utf-8", str(segment.name)[:64]
    try:
        known = codecs.lookup(charset).name in _TEXT_CHARSETS
    except LookupError:
        known = False
    if not known:
        raise APIError(400, f"The `{name}` part's charset {charset[:40]!r} is not a text encoding read here (send "
                            "UTF-8).", param=name, code="invalid_encoding")
    try:
        return data.decode(charset)
    except (UnicodeError, ValueError):
        raise APIError(400, f"The `{name}` part is not valid text ({charset}).", param=name,
                       code="invalid_encoding") from None


class _Utf8Headers(PushMultipartParser):
    """The parser reading part headers as bytes (Latin-1, which decodes any), each value then as UTF-8, a filename
    that is not UTF-8 kept as Latin-1 (see the module)."""

    def __init__(self, boundary: bytes, max_segment_count: int) -> None:
        super().__init__(boundary, max_segment_count=max_segment_count, header_charset="latin-1")

    def _create_segment(self, headerlist: list[tuple[str, str]]) -> MultipartSegment:
        """The library's segment of the headers read as UTF-8 (the library's hook). Raises APIError 400 for a part
        name or Content-Type that is not UTF-8, ParserError as the library."""
        decoded, raw = [], set()
        for key, value in headerlist:
            try:
                value = value.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                raw.add(key)  # kept as Latin-1: below says whether that is allowed
            decoded.append((key, value))
        segment = super()._create_segment(decoded)
        if not raw:
            return segment
        if "Content-Disposition" in raw:  # its name and filename split as Latin-1 text, each read as UTF-8 alone
            try:
                segment.name = segment.name.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                shown = segment.name.encode("latin-1")[:64]
                raise APIError(400, f"A part's name is not UTF-8 ({shown!r}): send the form's field names as UTF-8.",
                               code="invalid_encoding") from None
            if segment.filename:
                try:
                    segment.filename = segment.filename.encode("latin-1").decode("utf-8")
                except UnicodeDecodeError:
                    pass  # a Latin-1 name as curl sends it: read so
        if "Content-Type" in raw:  # what the part is: no guessing (other headers are not read, kept as Latin-1)
            name = str(segment.name)[:64]
            raise APIError(400, f"Non-UTF-8 header in part `{name}`: its Content-Type (send header values as UTF-8).",
                           param=name, code="invalid_encoding")
        return segment


async def _close(data: UploadFile | bytearray, fields: dict[str, list[Any]]) -> None:
    if isinstance(data, UploadFile):
        await data.close()
    for values in fields.values():
        for value in values:
            if isinstance(value, UploadFile):
                await value.close()
