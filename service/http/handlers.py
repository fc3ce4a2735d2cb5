"""Litestar exception handlers: every failure — a route's APIError, a typed engine or audio error (by
ERROR_TABLE), Litestar's own 400/404/405, and unexpected exceptions — answered in OpenAI's error shape."""

from __future__ import annotations

import logging
import re
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.types import ExceptionHandlersMap

from service.http.errors import ERROR_TABLE, INTERNAL_ERROR_MESSAGE, APIError, api_error, error_response
from service.http.retry_after import queue_retry_after
from service.state import scope_state

__all__ = ["EXCEPTION_HANDLERS"]

_log = logging.getLogger("tandem.service")


# pydantic puts union members and validator kinds into error locations ("content.str",
# "content.list[TextPart].0.text"); field names here are snake_case (form arrays end in "[]": `include[]`),
# so anything else is a tag.
_LOC_TAG = re.compile(r"^(str|int|float|bool|none|.*\[.+\].*|[A-Z]\w*)$")


def _field_path(key: Any) -> str | None:
    if key in (None, ""):
        return None
    parts = [part for part in str(key).split(".") if not _LOC_TAG.match(part)]
    return ".".join(parts) or None


def _extra_path(key: Any) -> str | None:
    # An unknown field's own name ends the path as the client sent it: a form's `stream_options[include_usage]`
    # looks like a tag, but is the field to name.
    head, _, name = str(key or "").rpartition(".")
    parent = _field_path(head)
    return f"{parent}.{name}" if parent and name else name or parent


# First path segments of /v1 routes, for a 404 of the same path without /v1.
_V1_ROOTS = frozenset({"chat", "completions", "responses", "models", "audio", "realtime"})
# TGI's generate routes: huggingface_hub's text_generation and automatic_speech_recognition POST to the base URL.
_TGI_ROUTES = frozenset({"/", "/v1", "/generate", "/generate_stream"})
_TGI_HINT = ("; TGI's generate API is not served here: /v1/completions (text), /v1/chat/completions, "
             "/v1/audio/transcriptions (a multipart form)")
# OpenAI routes with no model here to serve them: said, so a client's user learns why (not a wrong base_url).
_UNSERVED = {"/v1/embeddings": "this server serves no embeddings model",
             "/v1/responses/compact": "compaction is not served: nothing is compacted here (an input longer than the "
                                      "model's context is refused with context_length_exceeded)",
             "/v1/audio/speech": "text-to-speech is not served: this server runs no voice model (speech to text is "
                                 "/v1/audio/transcriptions)"}
# Anthropic's routes not served, by prefix (a batch's own routes are under it): said as the unserved OpenAI ones are.
_UNSERVED_UNDER = {"/v1/messages/batches": "message batches are not served here: send each request to /v1/messages"}
# Fields other servers take (mlx_lm.server, Ollama, llama.cpp): what to send here instead, or why not.
_OTHER_SERVERS = {
    "adapters": "adapters are not loaded per request here: serve the fine-tune with --adapter-path",
    "draft_model": "no speculative decoding here",
    "num_draft_tokens": "no speculative decoding here", "role_mapping": "the model's chat template formats roles",
    "num_predict": "send max_tokens", "repeat_penalty": "send repetition_penalty", "num_ctx": "the model's context is "
    "fixed at load", "keep_alive": "the model stays loaded", "options": "send the sampling fields at the top level",
    "format": "JSON output is not offered here", "think": "send reasoning_effort",
}


def _validation_error(exc: ValidationException) -> APIError:
    # Litestar's pydantic plugin reports [{"message", "key"}]; key is the dotted field path.
    extra = exc.extra if isinstance(exc.extra, list) else []
    if not extra:
        return APIError(400, "Request body must be a JSON object.", code="invalid_request_body")
    problems = [e if isinstance(e, dict) else {"message": str(e)} for e in extra]
    # For a union (content: str | parts) the deepest location says what was actually wrong; at one depth, a branch's
    # own words over another branch's type error (function_call {"name", "arguments"} read "should be 'none' or 'auto'").
    first = max(problems, key=lambda e: (len((_field_path(e.get("key")) or "").split(".")),
                                         not str(e.get("message", "")).startswith("Input should be")))
    message = str(first.get("message", exc.detail)).removeprefix("Value error, ")
    param = _field_path(first.get("key"))
    if param == "data":  # Litestar's name for the whole body (no request has a `data` field): it was empty or null
        return APIError(400, "We could not parse the JSON body of your request: it is empty or null (send a JSON "
                             "object).", code="invalid_json")
    if message == "Extra inputs are not permitted" and (param := _extra_path(first.get("key"))):
        # a field we do not know: as OpenAI words it
        unknown = sorted({p for e in problems if str(e.get("message", "")).endswith("Extra inputs are not permitted")
                          and (p := _extra_path(e.get("key")))})
        if len(unknown) > 1:  # OpenAI names them all; what to send instead after them, as for one field
            hints = "; ".join(f"{name}: {hint}" for name in unknown if (hint := _OTHER_SERVERS.get(name)))
            return APIError(400, f"Unrecognized request arguments supplied: {', '.join(unknown)}"
                            + (f" ({hints})" if hints else ""), param=unknown[0], code="unknown_parameter")
        hint = _OTHER_SERVERS.get(param)
        return APIError(400, f"Unrecognized request argument supplied: {param}" + (f" ({hint})" if hint else ""),
                        param=param, code="unknown_parameter")
    # Another branch of the same union fails at an ancestor of `param` (`content` is no string): not another field.
    others = {p for e in problems if (p := _field_path(e.get("key"))) != param
              and not (param or "").startswith(f"{p}.")}
    # The others by name ("(and 1 more fields)" read as part of the first's sentence).
    named = sorted(o for o in others if o)
    more = f" (also invalid: {', '.join(named[:3])}{', …' if len(named) > 3 else ''})" if named else ""
    text = f"{param}: {message}{more}" if param else f"{message}{more}"
    return APIError(400, text, param=param, code="invalid_value")


def _doubled_v1(path: str) -> bool:
    """Whether `path` is one of the API's under a second /v1 (/v1/v1/chat/...), not any path that begins so. Raises
    nothing."""
    parts = path.split("/")  # ["", "v1", "v1", root, ...]
    return len(parts) > 3 and parts[1] == parts[2] == "v1" and parts[3] in _V1_ROOTS


def _unserved_under(path: str) -> str | None:
    """Why nothing under one of _UNSERVED_UNDER's prefixes is served (None: `path` is under none). Raises nothing."""
    return next((why for prefix, why in _UNSERVED_UNDER.items()
                 if path.rstrip("/") == prefix or path.startswith(prefix + "/")), None)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
    if isinstance(exc, ValidationException):
        return error_response(_validation_error(exc))
    status = exc.status_code
    detail = str(exc.detail)
    if status == 400 and isinstance(exc.__cause__, SerializationException):
        return error_response(APIError(400, f"We could not parse the JSON body of your request: {detail}",
                                       code="invalid_json"))
    # An unserved route below one that takes an id (POST /v1/responses/compact matches GET /v1/responses/{id}): a
    # 404 saying why, not a 405 of the id's route.
    if status == 404 or status == 405 and request.url.path.rstrip("/") in _UNSERVED:
        path = request.url.path
        # A client whose base_url left out /v1 (mlx_lm.server answers both): say where the API is.
        hint = (f"; the API is under /v1: {request.method} /v1{path} (a client's base_url ends in /v1)"
                if path.lstrip("/").split("/")[0] in _V1_ROOTS else
                # a client that adds /v1 itself, given a base URL that ends in /v1 (NextChat, as the README gives it)
                f"; /v1 is twice in the path: {request.method} {path[3:]} (this client adds /v1 to the base URL "
                f"itself: give it the server's address without /v1)"
                if _doubled_v1(path) else
                _TGI_HINT if request.method == "POST" and (path.rstrip("/") or "/") in _TGI_ROUTES else
                f"; {_UNSERVED[path.rstrip('/')]}" if path.rstrip("/") in _UNSERVED else
                f"; {_unserved_under(path)}" if _unserved_under(path) else
                # the SDK's cancel: not a base_url mistake
                "; of a response this server offers POST /v1/responses and /v1/responses/input_tokens, GET or "
                "DELETE /v1/responses/{id} and GET /v1/responses/{id}/input_items"
                if path.startswith("/v1/responses/") else "")
        return error_response(APIError(404, f"Invalid URL ({request.method} {path}){hint}", code="not_found"))
    if status == 405:
        # Litestar names the route's methods in the exception's Allow header: pass it on (RFC 9110).
        allow = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "allow"}
        if request.method == "GET" and any(v.strip().lower() == "websocket" for v in allow.values()):
            # A websocket route met as plain HTTP: the client, or a proxy that drops Upgrade / Connection, did not ask
            # for the upgrade (RFC 9110's 426 names the protocol to switch to).
            return error_response(APIError(
                426, f"{request.url.path} is a websocket: connect with an Upgrade: websocket request (a reverse proxy "
                     "must pass the Upgrade and Connection headers on: see the README's reverse proxy section)",
                code="upgrade_required"), headers={"Upgrade": "websocket", "Connection": "Upgrade"})
        return error_response(
            APIError(405, f"Method {request.method} is not allowed on {request.url.path}", code="method_not_allowed"),
            headers=allow)
    return error_response(APIError(status, detail))


def _api_error(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    error = api_error(exc)
    if error.code == "queue_full" and (state := scope_state(request.scope)) is not None:
        # When the queue, full now, has room again (the table's 1 s had the SDKs' retries spent in ~2 s).
        error.retry_after = queue_retry_after(state.config.queue_limit, state.config.max_active,
                                              state.recent_durations)
    return error_response(error)


def _undecodable(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    # Only client bytes get decoded as text here (a multipart form field that is not UTF-8).
    return error_response(APIError(400, f"Part of the request is not valid text: {exc}", code="invalid_encoding"))


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    # Never leak a stack trace to a client; the log keeps it.
    _log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, INTERNAL_ERROR_MESSAGE, type="server_error"))


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    APIError: _api_error,
    **{kind: _api_error for kind in ERROR_TABLE},
    HTTPException: _http_error,
    UnicodeDecodeError: _undecodable,
    Exception: _unexpected,
}
