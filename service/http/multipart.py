"""A multipart form whose file parts are files even without a filename: the openai SDK sends
`file=(None, data, "audio/wav")` so, and Litestar reads such a part as text (undecodable audio: a 400 naming
nothing). `read_file_parts` is a route's `before_request`: it parses the form as Litestar does, but a part named
as one of the route's file fields becomes an UploadFile whatever its disposition says, and a text part that is not
UTF-8 is refused naming its field. Litestar's body extractor then takes the parsed form as its own.
"""

from __future__ import annotations

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
    that is not UTF-8, or a file field sent twice, naming it), ClientException 400 (a malformed form, or more than
    `part_limit` parts)."""
    fields: defaultdict[str, list[Any]] = defaultdict(list)
    chunk = await async_next(stream, b"")
    if not chunk:
        return fields
    data: UploadFile | bytearray = bytearray()
    try:
        with PushMultipartParser(boundary, max_segment_count=part_limit) as parser:
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
        raise ClientException("Invalid multipart/form-data") from exc
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


def _text(data: bytearray, segment: MultipartSegment) -> str:
    try:
        return data.decode(segment.charset or "utf-8")
    except (UnicodeDecodeError, LookupError):
        name = str(segment.name)[:64]
        raise APIError(400, f"The `{name}` part is not valid text ({segment.charset or 'utf-8'}).", param=name,
                       code="invalid_encoding") from None


async def _close(data: UploadFile | bytearray, fields: dict[str, list[Any]]) -> None:
    if isinstance(data, UploadFile):
        await data.close()
    for values in fields.values():
        for value in values:
            if isinstance(value, UploadFile):
                await value.close()
