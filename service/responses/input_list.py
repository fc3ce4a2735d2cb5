"""GET /v1/responses/{id}/input_items: the items a kept response was made from, as OpenAI lists them — each with
an `id` (given when the response is kept, so every page agrees), messages' text as content parts, a `status` — a
page at a time after an item id, oldest or newest first; and the `include` GET /v1/responses/{id} honours."""

from __future__ import annotations

import uuid
from typing import Any, Iterable, Literal, Sequence

from service.http.errors import APIError
from service.responses.history import seal_reasoning

__all__ = ["with_ids", "input_page", "sealed_output", "LISTED_INCLUDABLE"]

# An id's prefix for an item of each type that came without one (OpenAI's: msg_ for a message, fc_ for a call).
_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "custom_tool_call": "ctc",
             "custom_tool_call_output": "ctco", "reasoning": "rs"}

# `include` values the listing honours: a reasoning item's encrypted_content (this server's sealed thinking).
LISTED_INCLUDABLE = ("reasoning.encrypted_content",)


def with_ids(items: Iterable[dict[str, Any]], taken: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The items, each with an id no other has here nor in `taken` (the conversation before them): its own (the
    client's, or that of the item a reference named), else a new one. Raises nothing."""
    used = set(taken)
    out = []
    for item in items:
        item_id = item.get("id")
        if not isinstance(item_id, str) or item_id in used:  # a repeated id would make `after` ambiguous
            item = {**item, "id": f"{_PREFIXES.get(item.get('type', 'message'), 'item')}_{uuid.uuid4().hex}"}
        used.add(item["id"])
        out.append(item)
    return out


def _parts(content: Any, role: str) -> list[dict[str, Any]]:
    """A message's content as OpenAI lists it: parts, an assistant's `output_text` with its annotations."""
    kind = "output_text" if role == "assistant" else "input_text"
    parts: list[dict[str, Any]] = [{"type": kind, "text": content}] if isinstance(content, str) else content
    listed = []
    for part in parts:
        if part.get("type") in ("text", "input_text", "output_text"):
            part = {"type": kind, "text": part.get("text", "")}
            if kind == "output_text":
                part["annotations"] = []
        listed.append(part)
    return listed


def _listed(item: dict[str, Any], sealed: bool) -> dict[str, Any]:
    """One kept item in OpenAI's ResponseItem shape. `sealed`: a reasoning item carries its encrypted_content
    (include reasoning.encrypted_content). Raises nothing."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role", "user")
        return {"id": item["id"], "type": "message", "role": role, "content": _parts(item.get("content", ""), role),
                "status": item.get("status") or "completed"}
    if kind == "reasoning":
        listed = {k: v for k, v in item.items() if k != "encrypted_content"}
        if sealed:
            text = "".join(p.get("text", "") for p in item.get("content") or ()) or \
                "\n\n".join(p.get("text", "") for p in item.get("summary") or ())
            listed["encrypted_content"] = item.get("encrypted_content") or (seal_reasoning(text) if text else None)
        return listed
    return {**item, "status": item.get("status") or "completed"}


def _includable(include: Sequence[str], where: str) -> None:
    """Raises APIError 400 naming `include` for a value not in LISTED_INCLUDABLE (`where`: what is listed)."""
    for value in include:
        if value not in LISTED_INCLUDABLE:
            raise APIError(400, f"include: {value!r} cannot be included {where} here; only "
                                + ", ".join(LISTED_INCLUDABLE), param="include", code="invalid_value")


def sealed_output(response: dict[str, Any], include: Sequence[str]) -> dict[str, Any]:
    """A kept response as GET /v1/responses/{id} gives it: with include reasoning.encrypted_content, each reasoning
    item carries its thinking sealed (kept as it finished otherwise). Raises APIError 400 naming `include` for a
    value not honoured."""
    _includable(include, "in a retrieved response")
    if not include:
        return response
    return {**response, "output": [_listed(item, True) if item.get("type") == "reasoning" else item
                                   for item in response.get("output", [])]}


def input_page(items: Sequence[dict[str, Any]], *, limit: int, order: Literal["asc", "desc"], after: str | None,
               include: Sequence[str]) -> dict[str, Any]:
    """OpenAI's list object of `items` (kept oldest first): `limit` of them in `order`, from the one after `after`.

    Raises APIError 400 naming `include` for a value not honoured, `after` for an id not among the items."""
    _includable(include, "in input items")
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = 0
    if after is not None:
        found = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if found is None:
            raise APIError(400, f"after: no input item {after!r} in this response", param="after",
                           code="invalid_value")
        start = found + 1
    page = [_listed(item, "reasoning.encrypted_content" in include) for item in ordered[start:start + limit]]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)}
