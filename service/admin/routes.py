"""GET /v1/models, /health (readiness; also at /v1/health, Kubernetes' /readyz and vLLM's /ping), /livez
(liveness), /stats (engine.stats() as JSON) and /metrics (the same numbers for Prometheus)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, get, route
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter

from service.admin.anthropic_models import ANTHROPIC_QUERY, anthropic_model, anthropic_page, speaks_anthropic
from service.admin.metrics import CONTENT_TYPE
from service.admin.stats import stats_payload
from service.admin.schemas import AnthropicModel, AnthropicModelList, Health, Liveness, ModelCard, ModelList
from service.http.errors import model_not_found
from service.http.openapi import any_of_operation
from service.http.query import refuse_unknown_query
from service.http.schemas import ErrorResponse
from service.messages.replies import AnthropicError
from service.state import get_state

__all__ = ["ROUTES", "list_models", "retrieve_model", "health", "ping", "livez", "stats", "metrics"]


# OpenAI's error shape, or Anthropic's to an Anthropic client.
_ERROR = ErrorResponse | AnthropicError
# Either shape, documented as anyOf: OpenAI's loose schemas (few required fields) would match Anthropic's bodies too.
_EITHER = any_of_operation("EitherShapeOperation")
_LIST_ERRORS = {400: ResponseSpec(data_container=_ERROR, generate_examples=False, description="A query parameter "
                                  "not read (OpenAI's list reads none) or not valid")}
_MODEL_ERRORS = {400: ResponseSpec(data_container=_ERROR, generate_examples=False, description="Invalid request"),
                 404: ResponseSpec(data_container=_ERROR, generate_examples=False,
                                   description="Unknown model (code model_not_found; Anthropic's not_found_error)")}
_ANTHROPIC = ("With an `anthropic-version` header (the anthropic SDKs send it), Anthropic's Models API: its shape, "
              "errors in its shape, the chat model only. ")
_VERSION = Parameter(header="anthropic-version", description="Sent: answer in Anthropic's shape (not with an "
                     "OpenAI-Organization or OpenAI-Project header).")


@get("/v1/models", summary="List the served models", tags=["models"],
     responses=_LIST_ERRORS, operation_class=_EITHER,
     description="OpenAI's list: chat model first, then any other served model (speech); it reads no query "
                 "parameter. " + _ANTHROPIC + "A page of `limit` (1 to 1000, default 20) models after `after_id` "
                 "or before `before_id`.")
async def list_models(
    request: Request[Any, Any, Any],
    limit: Annotated[int, Parameter(ge=1, le=1000, description="Anthropic's: models in the page, 1 to 1000.")] = 20,
    before_id: Annotated[str | None, Parameter(description="Anthropic's: the page ends before this id.")] = None,
    after_id: Annotated[str | None, Parameter(description="Anthropic's: the page starts after this id.")] = None,
    anthropic_version: Annotated[str | None, _VERSION] = None,
) -> ModelList | AnthropicModelList:
    """OpenAI's list, or with anthropic-version Anthropic's page of the chat model(s).

    Raises APIError 400 naming a query parameter the list does not read, or a cursor that is not a listed id."""
    state = get_state(request)
    anthropic = speaks_anthropic(request.scope)
    refuse_unknown_query(request.query_params, ANTHROPIC_QUERY if anthropic else frozenset(),
                         "Anthropic's model list reads limit, before_id and after_id" if anthropic else
                         "OpenAI's model list reads none; Anthropic's, sent with an anthropic-version header, reads "
                         "limit, before_id and after_id")
    if anthropic:
        chat = [card for card in state.model_cards() if card.kind == "chat"]
        return anthropic_page(chat, limit, before_id, after_id)
    return ModelList(data=state.model_cards())


@get("/v1/models/{model_id:path}", summary="Retrieve a served model", tags=["models"], responses=_MODEL_ERRORS,
     operation_class=_EITHER,
     description="One served model by id (ids may contain slashes, e.g. org/name). " + _ANTHROPIC + "An alias of "
                 "the chat model answers with its id.")
async def retrieve_model(request: Request[Any, Any, Any], model_id: str,
                         anthropic_version: Annotated[str | None, _VERSION] = None) -> ModelCard | AnthropicModel:
    """One served model by id, in Anthropic's shape for an Anthropic client (chat models only).

    Raises APIError 404 model_not_found for a model this server does not serve (to an Anthropic client: any but the
    chat model)."""
    state = get_state(request)
    wanted = model_id.lstrip("/")
    anthropic = speaks_anthropic(request.scope)
    cards = [card for card in state.model_cards() if card.kind == "chat" or not anthropic]
    for card in cards:
        if card.id == wanted:
            return anthropic_model(card) if anthropic else card
    if cards and cards[0].kind == "chat" and wanted in state.model_aliases:
        return anthropic_model(cards[0]) if anthropic else cards[0]
    raise model_not_found(wanted, [card.id for card in cards])


_NOT_READY = {503: ResponseSpec(data_container=Health, generate_examples=False,
                                description="loading, restarting, stopping, or failing (with the error)")}


@get(["/health", "/v1/health", "/readyz"], summary="Readiness", tags=["admin"], responses=_NOT_READY,
     description="200 `ok` when requests are served; 503 while loading, restarting or stopping (with Retry-After) "
                 "and while the engine cannot run rows (`failing`, with the error). Kubernetes' readinessProbe (and "
                 "startupProbe); its livenessProbe is /livez.")
async def health(request: Request[Any, Any, Any]) -> Response[Health]:
    """200 when ready; 503 while loading, restarting (a respawned worker or engine process) or stopping (with
    Retry-After), and while the engine cannot run any row (its steps keep failing: status "failing" with the error).
    Open without an API key. Raises nothing."""
    return _health(request)


_DEAD = {503: ResponseSpec(data_container=Liveness, generate_examples=False,
                           description="the engine cannot run rows and will not recover by itself (`failing`)")}


@get("/livez", summary="Liveness", tags=["admin"], responses=_DEAD,
     description="200 `alive` while this server runs, loading, restarting and stopping included (a long first load "
                 "must not get the pod restarted); 503 `failing` only when /health says `failing`: the engine's steps "
                 "keep failing, it is hung, or under --isolate its engine process stopped for good, which only a "
                 "restart cures. Kubernetes' livenessProbe; open without an API key.")
async def livez(request: Request[Any, Any, Any]) -> Response[Liveness]:
    """200 alive unless the ready engine is failing (not restarting): 503 failing with the error. Raises nothing."""
    # Of readiness's states only `failing` does not end by itself (loading, restarting and stopping do): a failing
    # engine takes the pod out of the Service, so no request comes to reset its run of failures; a restart is the
    # cure, and the probe's failureThreshold spares a passing fault.
    readiness = _health(request).content
    if readiness.status == "failing":
        return Response(Liveness(status="failing", error=readiness.error), status_code=503)
    return Response(Liveness(status="alive"), status_code=200)


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


ROUTES = [list_models, retrieve_model, health, ping, livez, stats, metrics]
