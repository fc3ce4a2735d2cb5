"""Azure OpenAI's `api-version`, which AzureOpenAI adds to every request, is taken on every route; routes that read
their query still refuse any other parameter they do not read, by name."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from litestar.testing import TestClient

from service.http.errors import APIError
from service.http.query import refuse_unknown_query

API_VERSION = "2024-02-01"


def azure(client: TestClient[Any]) -> openai.AzureOpenAI:
    """openai-python's Azure client against the app: `api-version` on every request's query."""
    return openai.AzureOpenAI(base_url=f"{client.base_url}/v1", api_version=API_VERSION, api_key="unused",
                              http_client=client, max_retries=0)


def test_an_azure_client_lists_and_retrieves_models(client: TestClient[Any]) -> None:
    # models.list() was a 400 unknown_parameter naming api-version.
    sdk = azure(client)
    assert [m.id for m in sdk.models.list()] == ["fake-model"]
    assert sdk.models.retrieve("fake-model").id == "fake-model"


def test_an_azure_client_retrieves_and_deletes_a_kept_response(client: TestClient[Any]) -> None:
    sdk = azure(client)
    created = sdk.responses.create(model="fake-model", input="hi")
    assert sdk.responses.retrieve(created.id).id == created.id
    assert sdk.responses.delete(created.id) is None
    items = client.get(f"/v1/responses/{created.id}/input_items?api-version={API_VERSION}")
    assert items.status_code == 404  # deleted: found by id, not refused for its query


@pytest.mark.parametrize("path", ["/v1/models", "/v1/responses/resp_x", "/v1/responses/resp_x/input_items"])
def test_other_unknown_query_parameters_are_still_refused_by_name(client: TestClient[Any], path: str) -> None:
    error = client.get(f"{path}?api-version={API_VERSION}&foo=1").json()["error"]
    assert (error["param"], error["code"]) == ("foo", "unknown_parameter")


def test_only_api_version_passes_everywhere() -> None:
    refuse_unknown_query(["api-version", "limit"], frozenset({"limit"}), "reads limit")
    with pytest.raises(APIError) as refused:
        refuse_unknown_query(["api_version", "api-version"], frozenset(), "reads none")
    assert refused.value.param == "api_version"
    assert refused.value.message == "Unrecognized query parameter: api_version (reads none)"
