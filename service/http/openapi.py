"""OpenAPI helpers for routes: SSE operations documented beside their JSON answer, error response specs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Operation, RequestBody, Schema
from pydantic import BaseModel

from service.http.schemas import ErrorResponse

__all__ = ["inline_json_schema", "ok_content_operation", "any_of_operation", "sse_operation", "sse_event_schema", "raw_body_operation",
           "error_responses",
           "MODEL_ERRORS",
           "CHAT_ERRORS"]


def error_responses(descriptions: Mapping[int, str]) -> dict[int, ResponseSpec]:
    """status → ResponseSpec documenting the OpenAI error body with `description`. Raises nothing."""
    return {status: ResponseSpec(data_container=ErrorResponse, description=text, generate_examples=False)
            for status, text in descriptions.items()}


# Routes that take a `model`: a bad request, or a model this server does not serve.
MODEL_ERRORS = error_responses({400: "Invalid request (OpenAI error shape)",
                                404: "Unknown model (code model_not_found)"})
# Routes that run a generation: also refused at capacity, past the deadline, or while unavailable.
CHAT_ERRORS = {**MODEL_ERRORS, **error_responses({
    413: "Body over the size limit (code request_too_large)",
    429: "At capacity: more than --max-queued requests wait (code queue_full; Retry-After)",
    503: "Loading, restarting or shutting down (Retry-After)",
    504: "Past --request-timeout (code request_timeout)"})}


def inline_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema (serialization mode) with every $ref resolved in place. Raises nothing for
    non-recursive models."""
    schema = model.model_json_schema(mode="serialization")
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(definitions[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(value) for value in node]
        return node

    return resolve(schema)


def ok_content_operation(content: Mapping[str, dict[str, Any]], name: str) -> type[Operation]:
    """An Operation class whose 200 response documents `content` (media type → JSON schema) beside what
    Litestar derived from the handler (it documents one media type per status). Raises nothing."""

    @dataclass
    class ContentOperation(Operation):
        def __post_init__(self) -> None:
            ok = (self.responses or {}).get("200")
            if isinstance(ok, OpenAPIResponse):
                added = {media: OpenAPIMediaType(schema=schema)  # type: ignore[arg-type]  # a plain JSON-schema dict
                         for media, schema in content.items()}
                ok.content = {**(ok.content or {}), **added}

    ContentOperation.__name__ = name
    return ContentOperation


def any_of_operation(name: str) -> type[Operation]:
    """An Operation class whose responses document a union (a route answering in one of two APIs' shapes) as anyOf,
    not Litestar's oneOf: a body may match both shapes' schemas (few of their fields are required). Raises nothing."""

    @dataclass
    class AnyOfOperation(Operation):
        def __post_init__(self) -> None:
            for response in (self.responses or {}).values():
                for media in (response.content or {}).values() if isinstance(response, OpenAPIResponse) else ():
                    if isinstance(media.schema, Schema) and media.schema.one_of:
                        media.schema.any_of, media.schema.one_of = media.schema.one_of, None

    AnyOfOperation.__name__ = name
    return AnyOfOperation


def raw_body_operation(content: Mapping[str, str], description: str, name: str) -> type[Operation]:
    """An Operation class documenting a raw (non-JSON) request body the handler reads itself: media type
    → what it carries, each as a binary string. Raises nothing."""

    @dataclass
    class RawBodyOperation(Operation):
        def __post_init__(self) -> None:
            self.request_body = RequestBody(
                required=True, description=description,
                content={media: OpenAPIMediaType(schema={"type": "string", "format": "binary",  # type: ignore[arg-type]  # a JSON-schema dict
                                                         "description": text})
                         for media, text in content.items()})

    RawBodyOperation.__name__ = name
    return RawBodyOperation


def sse_event_schema(*payloads: type[BaseModel], done: bool = True) -> dict[str, Any]:
    """The schema of one server-sent event: its `data` field is JSON (one of `payloads`, or an error in
    OpenAI's shape sent after the headers went out) or, with `done`, the closing `[DONE]`. Raises nothing."""
    models: list[type[BaseModel]] = [*payloads, ErrorResponse]
    json_data = {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"oneOf": [inline_json_schema(p) for p in models]}}
    data = {"anyOf": [{"const": "[DONE]"}, json_data]} if done else json_data
    return {"type": "object", "required": ["data"], "properties": {"data": data, "event": {"type": "string"}},
            "description": "One server-sent event (`data: <json>`)" + (", the last one `data: [DONE]`" if done else "")}


def sse_operation(event: type[BaseModel]) -> type[Operation]:
    """An Operation class that also documents the 200 response as `text/event-stream` of `event` objects
    (`stream: true` answers with that instead of the JSON body). Raises nothing."""
    return ok_content_operation({"text/event-stream": sse_event_schema(event)}, f"{event.__name__}StreamOperation")
