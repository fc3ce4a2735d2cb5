"""How a body that fails validation is answered: the deepest problem first, the other fields by name."""

from __future__ import annotations

from typing import Any


def test_a_body_with_two_bad_fields_names_both(client: Any) -> None:
    # It read "… only reasoning.encrypted_content (and 1 more fields)", as if part of the first field's sentence.
    response = client.post("/v1/responses", json={"input": "hi", "include": ["file_search_call.results"],
                                                  "top_logprobs": 2})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] in ("include", "top_logprobs")
    other = "top_logprobs" if error["param"] == "include" else "include"
    assert error["message"].endswith(f"(also invalid: {other})"), error["message"]


def test_a_response_route_not_offered_says_which_are(client: Any) -> None:
    # The SDK's input_items.list read "Invalid URL", as if the client's base_url were wrong.
    response = client.get("/v1/responses/resp_1/input_items")
    assert response.status_code == 404 and "GET or DELETE /v1/responses/{id}" in response.json()["error"]["message"]
