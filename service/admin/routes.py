"""GET /v1/models, /health (also at /v1/health and vLLM's /ping), /stats (engine.stats() as JSON) and /metrics (the
same numbers for Prometheus)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get, route
from litestar.openapi.datastructures import ResponseSpec

from service.admin.metrics import CONTENT_TYPE
from service.admin.stats import stats_payload
from service.admin.schemas import Health, ModelCard, ModelList
from service.http.errors import model_not_found
from service.http.openapi import MODEL_ERRORS
from service.state import get_state

__all__ = ["ROUTES", "list_models", "retrieve_model", "health", "ping", "stats", "metrics"]


@get("/v1/models", summary="List the served models", tags=["models"])
async def list_models(request: Request[Any, Any, Any]) -> ModelList:
    """Chat model first, then any other served model (speech). Raises nothing."""
    return ModelList(data=get_state(request).model_cards())


@get("/v1/models/{model_id:path}", summary="Retrieve a served model", tags=["models"], responses=MODEL_ERRORS)
async def retrieve_model(request: Request[Any, Any, Any], model_id: str) -> ModelCard:
    """One served model by id (ids may contain slashes, e.g. org/name).

    Raises APIError 404 model_not_found for a model this server does not serve."""
    state = get_state(request)
    wanted = model_id.lstrip("/")
    cards = state.model_cards()
    for card in cards:
        if card.id == wanted:
            return card
    if cards and cards[0].kind == "chat" and wanted in state.model_aliases:
        return cards[0]
    raise model_not_found(wanted, [card.id for card in cards])


_NOT_READY = {503: ResponseSpec(data_container=Health, generate_examples=False,
                                description="loading, restarting, stopping, or failing (with the error)")}


@get(["/health", "/v1/health"], summary="Liveness and readiness", tags=["admin"], responses=_NOT_READY)
async def health(request: Request[Any, Any, Any]) -> Response[Health]:
    """200 when ready; 503 while loading, restarting (a respawned worker or engine process) or stopping (with
    Retry-After), and while the engine cannot run any row (its steps keep failing: status "failing" with the error).
    Open without an API key. Raises nothing."""
    return _health(request)


# vLLM's health check (SageMaker's, hence POST too): the same answer as /health.
@route("/ping", http_method=["GET", "POST"], status_code=200, summary="Liveness and readiness, as vLLM's /ping",
       tags=["admin"], responses=_NOT_READY,
       description="/health's answer, for clients that probe vLLM's /ping (GET or POST).")
async def ping(request: Request[Any, Any, Any]) -> Response[Health]:
    """/health's answer. Raises nothing."""
    return _health(request)


def _health(request: Request[Any, Any, Any]) -> Response[Health]:
    state = get_state(request)
    if state.phase != "ready":
        return Response(Health(status=state.phase, model=state.chat_model_name), status_code=503,
                        headers={"Retry-After": "5"})
    engine_health = state.engine.health() if state.engine is not None else {"ok": True}
    if not engine_health.get("ok", True):
        restarting = engine_health.get("status") == "restarting"
        body = Health(status="restarting" if restarting else "failing", model=state.chat_model_name,
                      error=engine_health.get("error"))
        # An engine process reloading (--isolate) is back soon, as a loading worker is; a failing engine may not be.
        headers = {"Retry-After": str(engine_health.get("retry_after", 5))} if restarting else {}
        return Response(body, status_code=503, headers=headers)
    return Response(Health(status="ok", model=state.chat_model_name), status_code=200)


@get("/stats", summary="Scheduler statistics",
     description="Active/queued rows, tokens/s, plan reasons, KV bytes, and every enforced limit under `limits`.",
     tags=["admin"])
async def stats(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """engine.stats() plus uptime, phase and limits. Raises nothing."""
    return stats_payload(get_state(request))


@get("/metrics", summary="Prometheus metrics", media_type=CONTENT_TYPE, tags=["admin"])
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus text format (prometheus-client). Raises nothing."""
    return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE)


ROUTES = [list_models, retrieve_model, health, ping, stats, metrics]
