"""Anthropic's Models API on GET /v1/models and /v1/models/{id}: the anthropic SDKs (`client.models.list()`,
`retrieve`) call OpenAI's paths with the `anthropic-version` header they always send, and read another shape — the
chat model only (an Anthropic client picks a chat model from the list), paged by `limit`, `before_id`, `after_id`."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from service.admin.schemas import AnthropicModel, AnthropicModelList, ModelCard
from service.http.auth import header
from service.http.errors import APIError

__all__ = ["MODELS_PATH", "ANTHROPIC_QUERY", "speaks_anthropic", "anthropic_models_request", "anthropic_model",
           "anthropic_page"]

MODELS_PATH = "/v1/models"
# The query parameters Anthropic's list reads; OpenAI's reads none.
ANTHROPIC_QUERY = frozenset({"limit", "before_id", "after_id"})
# Headers only OpenAI's SDK sends (its organization and project): such a request wants OpenAI's shape whatever else
# it carries.
_OPENAI_ONLY = (b"openai-organization", b"openai-project")


def speaks_anthropic(scope: Mapping[str, Any]) -> bool:
    """Whether a request is an Anthropic client's: it sends `anthropic-version` and nothing only OpenAI's SDK sends.
    Raises nothing."""
    return header(scope, b"anthropic-version") is not None and all(header(scope, h) is None for h in _OPENAI_ONLY)


def anthropic_models_request(scope: Mapping[str, Any]) -> bool:
    """Whether a request is an Anthropic client's on /v1/models or /v1/models/{id} (its errors answered in
    Anthropic's shape). Raises nothing."""
    path = str(scope.get("path", "")) if scope.get("type") == "http" else ""
    return (path == MODELS_PATH or path.startswith(MODELS_PATH + "/")) and speaks_anthropic(scope)


def anthropic_model(card: ModelCard) -> AnthropicModel:
    """`card` in Anthropic's shape; its `created` (when the server started serving it) as RFC 3339. Raises nothing."""
    created = datetime.fromtimestamp(card.created, timezone.utc).isoformat().replace("+00:00", "Z")
    return AnthropicModel(id=card.id, display_name=card.id, created_at=created)


def _index(ids: list[str], cursor: str, name: str) -> int:
    if cursor not in ids:
        raise APIError(400, f"{name}: no model `{cursor[:80]}` is listed here (listed: {', '.join(ids) or 'none'})",
                       param=name, code="invalid_value")
    return ids.index(cursor)


def anthropic_page(cards: Sequence[ModelCard], limit: int, before_id: str | None,
                   after_id: str | None) -> AnthropicModelList:
    """The page of `cards` Anthropic's list answers: the first `limit`, those right after `after_id`, or those right
    before `before_id`.

    Raises APIError 400 naming a cursor that is not a listed id, or both cursors at once."""
    if before_id is not None and after_id is not None:
        raise APIError(400, "before_id and after_id: send one cursor, not both", param="before_id",
                       code="invalid_value")
    ids = [card.id for card in cards]
    if before_id is not None:
        end = _index(ids, before_id, "before_id")
        start = max(0, end - limit)
        more = start > 0
    else:
        start = _index(ids, after_id, "after_id") + 1 if after_id is not None else 0
        end = min(len(cards), start + limit)
        more = end < len(cards)
    data = [anthropic_model(card) for card in cards[start:end]]
    return AnthropicModelList(data=data, has_more=more, first_id=data[0].id if data else None,
                              last_id=data[-1].id if data else None)
