"""Query parameters: the ones every route takes, and the one refusal of any other where a route reads its query.

Azure OpenAI's `api-version` is taken everywhere and read nowhere: openai-python's `AzureOpenAI(api_version=...)`
and openai-node's `AzureOpenAI` add it to every request (a list of models refused it, so `models.list()` failed).
"""

from __future__ import annotations

from typing import AbstractSet, Iterable

from service.http.errors import APIError

__all__ = ["AZURE_API_VERSION", "refuse_unknown_query"]

AZURE_API_VERSION = "api-version"
_EVERY_ROUTE = frozenset({AZURE_API_VERSION})


def refuse_unknown_query(names: Iterable[str], known: AbstractSet[str], reads: str) -> None:
    """Raises APIError 400 naming the first (sorted) query parameter in `names` that is neither in `known` nor taken
    on every route; `reads`: what the route reads, said in the message (a typo must not pass as a default)."""
    if unknown := sorted(set(names) - known - _EVERY_ROUTE):
        raise APIError(400, f"Unrecognized query parameter: {unknown[0]} ({reads})", param=unknown[0],
                       code="unknown_parameter")
