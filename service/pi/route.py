"""GET /v1/pi/provider: a models.json document with the provider entry for the served chat model."""

from __future__ import annotations

from typing import Any

from litestar import Request, get

from service.pi.provider import PROVIDER_NAME, provider_entry, thinking_format
from service.state import get_state

__all__ = ["pi_provider"]


@get("/v1/pi/provider", summary="pi provider definition", tags=["pi"],
     description="A models.json document (`{\"providers\": {\"mlx-tandem\": {...}}}`) for the pi coding agent.")
async def pi_provider(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The provider entry for the loaded chat model; `models` is empty when no chat model is loaded. Raises nothing."""
    state = get_state(request)
    base_url = str(request.base_url).rstrip("/") + "/v1"
    name = state.chat_model_name
    if name is None:
        entry = provider_entry("none", base_url, 4096, thinking=None)
        entry["models"] = []
    else:
        engine = state.engine
        # What a request can really use (the memory budget may hold less than the model's context).
        context = getattr(engine, "max_model_len", None) or getattr(engine, "context_length", None) or 4096
        entry = provider_entry(name, base_url, context, thinking=thinking_format(getattr(engine, "tokenizer", None)))
    return {"providers": {PROVIDER_NAME: entry}}
