"""How a body that fails validation is answered: the deepest problem first, the other fields by name."""

from __future__ import annotations

from typing import Any

import pytest


def test_a_body_with_two_bad_fields_names_both(client: Any) -> None:
    # It read "… only reasoning.encrypted_content (and 1 more fields)", as if part of the first field's sentence.
    response = client.post("/v1/responses", json={"input": "hi", "include": ["file_search_call.results"],
                                                  "top_logprobs": 21})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] in ("include", "top_logprobs")
    other = "top_logprobs" if error["param"] == "include" else "include"
    assert error["message"].endswith(f"(also invalid: {other})"), error["message"]


def test_a_response_route_not_offered_says_which_are(client: Any) -> None:
    # The SDK's responses.cancel read "Invalid URL", as if the client's base_url were wrong.
    response = client.post("/v1/responses/resp_1/cancel")
    message = response.json()["error"]["message"]
    assert response.status_code == 404 and "GET or DELETE /v1/responses/{id}" in message
    assert "GET /v1/responses/{id}/input_items" in message


@pytest.mark.parametrize("path", ["/", "/v1", "/v1/", "/generate", "/generate_stream"])
def test_tgis_generate_routes_say_what_is_served_instead(client: Any, path: str) -> None:
    # huggingface_hub's text_generation and automatic_speech_recognition POST to the base URL (TGI's generate API).
    response = client.post(path, content=b"RIFF\x00\x00\x00\x00WAVE", headers={"content-type": "audio/x-wav"})
    error = response.json()["error"]
    assert response.status_code == 404 and error["code"] == "not_found"
    assert error["message"] == (f"Invalid URL (POST {path}); TGI's generate API is not served here: /v1/completions "
                                "(text), /v1/chat/completions, /v1/audio/transcriptions (a multipart form)")
    # OpenAI's wording alone elsewhere, and for another method
    assert client.post("/v2/generate", json={}).json()["error"]["message"] == "Invalid URL (POST /v2/generate)"
    assert "TGI" not in client.delete(path).json()["error"]["message"]


@pytest.mark.parametrize("path, words", [("/v1/embeddings", "this server serves no embeddings model"),
                                         ("/v1/audio/speech", "text-to-speech is not served: "),
                                         # was a 405: it matches GET /v1/responses/{id}
                                         ("/v1/responses/compact", "compaction is not served: ")])
def test_openai_routes_without_a_model_here_say_what_is_not_served(client: Any, path: str, words: str) -> None:
    # A bare "Invalid URL" read as a wrong base_url; OpenAI's 404 shape and code stay.
    response = client.post(path, json={"model": "m", "input": "hi"})
    error = response.json()["error"]
    assert response.status_code == 404 and error["code"] == "not_found" and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"Invalid URL (POST {path}); {words}"), error


def test_several_unknown_fields_keep_their_hints(client: Any) -> None:
    # Open WebUI's Ollama fields came together and lost what to send instead ("... supplied: num_ctx, repeat_penalty").
    body = {"messages": [{"role": "user", "content": "x"}], "repeat_penalty": 1.1, "num_ctx": 4096, "foo": 1}
    error = client.post("/v1/chat/completions", json=body).json()["error"]
    assert error["message"] == ("Unrecognized request arguments supplied: foo, num_ctx, repeat_penalty (num_ctx: the "
                                "model's context is fixed at load; repeat_penalty: send repetition_penalty)")
    assert error["param"] == "foo" and error["code"] == "unknown_parameter"


def test_a_doubled_v1_says_the_client_adds_v1_itself(client: Any) -> None:
    # NextChat appends v1/chat/completions to its base URL: given http://host:8080/v1 it POSTed /v1/v1/...
    error = client.post("/v1/v1/chat/completions", json={}).json()["error"]
    assert error["code"] == "not_found" and error["message"] == (
        "Invalid URL (POST /v1/v1/chat/completions); /v1 is twice in the path: POST /v1/chat/completions (this "
        "client adds /v1 to the base URL itself: give it the server's address without /v1)")
    # only where the path without it is the API's: not another wrong path
    for path in ("/v1/v1/nonexistent", "/v1/v1/v1/models", "/v1/v1/"):
        assert "twice" not in client.post(path, json={}).json()["error"]["message"], path


@pytest.mark.parametrize("method, path", [("POST", "/v1/messages/batches"), ("GET", "/v1/messages/batches"),
                                          ("GET", "/v1/messages/batches/msgbatch_1/results"),
                                          ("POST", "/v1/messages/batches/msgbatch_1/cancel")])
def test_message_batches_say_to_send_each_request_to_messages(client: Any, method: str, path: str) -> None:
    # The anthropic SDK's messages.batches read a bare "Invalid URL", as if its base_url were wrong.
    response = client.request(method, path, headers={"anthropic-version": "2023-06-01"}, json={"requests": []})
    assert response.status_code == 404 and response.json()["type"] == "error", response.text
    assert response.json()["error"] == {"type": "not_found_error", "message": f"Invalid URL ({method} {path}); message "
                                        "batches are not served here: send each request to /v1/messages"}
