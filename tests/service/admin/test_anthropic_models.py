"""GET /v1/models and /v1/models/{id} for an Anthropic client (the anthropic SDKs' models.list and retrieve): its
shape, its pagination and its errors; OpenAI's answer unchanged without anthropic-version."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.admin.anthropic_models import anthropic_page
from service.admin.schemas import ModelCard
from service.app import create_app
from service.config import ServiceConfig
from service.http.errors import APIError
from service.state import AppState
from tests.service.fake_engine import FakeEngine

# What the anthropic SDKs send on every request.
ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "k"}


@pytest.fixture
def served(fake_engine: FakeEngine) -> Iterator[TestClient[Any]]:
    """The chat model and a Whisper model, served."""
    state = AppState(engine=fake_engine)
    state.model_aliases.add("claude-sonnet-4-5")
    state.extra_models["whisper-tiny"] = ModelCard(id="whisper-tiny", kind="transcription")
    with TestClient(create_app(state)) as client:
        yield client


def test_an_anthropic_client_lists_the_chat_model_in_anthropics_shape(served: TestClient[Any]) -> None:
    # The anthropic SDK's models.list() read OpenAI's {"object": "list"} (no has_more, no type) and found Whisper in it.
    response = served.get("/v1/models", headers=ANTHROPIC)
    body = response.json()
    assert response.status_code == 200, body
    assert body == {"data": [body["data"][0]], "has_more": False, "first_id": "fake-model", "last_id": "fake-model"}
    model = body["data"][0]
    assert (model["type"], model["id"], model["display_name"]) == ("model", "fake-model", "fake-model")
    assert datetime.fromisoformat(model["created_at"]).utcoffset() is not None  # RFC 3339, with its zone
    assert set(model) == {"type", "id", "display_name", "created_at"}


def test_without_anthropic_version_the_list_is_openais_as_before(served: TestClient[Any]) -> None:
    for headers in ({}, {**ANTHROPIC, "OpenAI-Organization": "org-1"}):  # OpenAI's SDK's own header wins
        body = served.get("/v1/models", headers=headers).json()
        assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["fake-model", "whisper-tiny"]


def test_openais_list_refuses_the_query_it_does_not_read(served: TestClient[Any]) -> None:
    # `?limit=1` and `?after=x` were silently ignored: the whole list came back.
    for query in ("limit=1", "after=fake-model"):
        error = served.get(f"/v1/models?{query}").json()["error"]
        name = query.partition("=")[0]
        assert (error["param"], error["code"]) == (name, "unknown_parameter")
        assert error["message"].startswith(f"Unrecognized query parameter: {name} (OpenAI's model list reads none")


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=ten", "foo=1", "after_id=nope",
                                   "before_id=nope", "before_id=fake-model&after_id=fake-model"])
def test_an_anthropic_clients_bad_query_is_a_400_in_anthropics_shape(served: TestClient[Any], query: str) -> None:
    response = served.get(f"/v1/models?{query}", headers=ANTHROPIC)
    body = response.json()
    assert response.status_code == 400 and body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(query.partition("=")[0]) or "foo" in body["error"]["message"]


def test_an_anthropic_client_pages_through_the_list(served: TestClient[Any]) -> None:
    first = served.get("/v1/models?limit=1", headers=ANTHROPIC).json()
    assert [m["id"] for m in first["data"]] == ["fake-model"] and first["has_more"] is False
    after = served.get("/v1/models?after_id=fake-model&limit=1000", headers=ANTHROPIC).json()
    assert after == {"data": [], "has_more": False, "first_id": None, "last_id": None}


def _cards(*ids: str) -> list[ModelCard]:
    return [ModelCard(id=i, created=86400, kind="chat") for i in ids]


def test_a_page_is_limit_models_after_or_before_a_cursor() -> None:
    cards = _cards("a", "b", "c", "d", "e")
    page = anthropic_page(cards, 2, None, None)
    assert ([m.id for m in page.data], page.has_more, page.first_id, page.last_id) == (["a", "b"], True, "a", "b")
    assert page.data[0].created_at == "1970-01-02T00:00:00Z"
    page = anthropic_page(cards, 2, None, "b")
    assert ([m.id for m in page.data], page.has_more) == (["c", "d"], True)
    page = anthropic_page(cards, 2, None, "c")
    assert ([m.id for m in page.data], page.has_more) == (["d", "e"], False)
    # before_id: the page right before it; has_more says whether more lie before that page
    page = anthropic_page(cards, 2, "e", None)
    assert ([m.id for m in page.data], page.has_more) == (["c", "d"], True)
    page = anthropic_page(cards, 2, "c", None)
    assert ([m.id for m in page.data], page.has_more) == (["a", "b"], False)
    with pytest.raises(APIError, match="after_id: no model `z` is listed here"):
        anthropic_page(cards, 2, None, "z")


def test_an_anthropic_client_retrieves_the_chat_model_by_id_or_alias(served: TestClient[Any]) -> None:
    listed = served.get("/v1/models", headers=ANTHROPIC).json()["data"][0]
    assert set(listed) == {"type", "id", "display_name", "created_at"} and listed["id"] == "fake-model"
    for name in ("fake-model", "claude-sonnet-4-5"):
        response = served.get(f"/v1/models/{name}", headers=ANTHROPIC)
        assert response.status_code == 200 and response.json() == listed, response.text
    for name in ("fake-model", "whisper-tiny"):  # OpenAI's cards without the header, Whisper's too
        assert served.get(f"/v1/models/{name}").json()["object"] == "model"


@pytest.mark.parametrize("name", ["whisper-tiny", "nope"])
def test_an_anthropic_clients_unknown_model_is_its_not_found_error(served: TestClient[Any], name: str) -> None:
    response = served.get(f"/v1/models/{name}", headers=ANTHROPIC)
    assert response.status_code == 404
    assert response.json() == {"type": "error", "error": {
        "type": "not_found_error",
        "message": f"The model `{name}` does not exist or is not served here (served: fake-model)."}}


def test_the_guards_refusal_of_an_anthropic_client_is_in_anthropics_shape(fake_engine: FakeEngine) -> None:
    state = AppState(engine=fake_engine, config=ServiceConfig(api_keys=("sekrit",)))
    with TestClient(create_app(state)) as client:
        refused = client.get("/v1/models", headers=ANTHROPIC)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert client.get("/v1/models").json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape without it
