"""openapi/openapi.json is exactly what the app serves (regenerate with `tandem openapi`)."""

from __future__ import annotations

import json

from litestar.testing import TestClient

from service.app import create_app
from service.openapi_document import SPEC_PATH, openapi_drift
from service.state import AppState


def test_committed_openapi_matches_the_served_schema() -> None:
    with TestClient(create_app(AppState())) as client:
        served = client.get("/docs/openapi.json").json()
    committed = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    assert committed == served, "openapi/openapi.json is stale: run `uv run tandem openapi`"
    assert openapi_drift() is None


def test_schema_documents_the_api() -> None:
    document = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    # Relative: /docs' "Try it out" called http://127.0.0.1:8080 whatever the port or a proxy's prefix.
    assert document["servers"] == [{"url": ".."}]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/stats"):
        assert path in document["paths"], path
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert "200" in chat["responses"] and "201" not in chat["responses"]
    assert {"ChatCompletionRequest", "ChatCompletion", "ErrorResponse", "Usage"} <= set(document["components"]["schemas"])


def test_the_transcription_answer_has_a_schema_per_format() -> None:
    document = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    content = document["paths"]["/v1/audio/transcriptions"]["post"]["responses"]["200"]["content"]
    assert {"application/json", "text/plain", "text/vtt", "text/event-stream"} <= set(content)
    titles = {option["title"] for option in content["application/json"]["schema"]["oneOf"]}
    assert titles == {"Transcription", "VerboseTranscription"}
    data = content["text/event-stream"]["schema"]["properties"]["data"]  # one event; its data is JSON
    events = {option["title"] for option in data["contentSchema"]["oneOf"]}
    assert events == {"TranscriptTextDelta", "TranscriptTextDone", "ErrorResponse"}


def test_drift_is_reported(tmp_path) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_text("{}\n")
    assert "differs" in (openapi_drift(stale) or "")
    assert "missing" in (openapi_drift(tmp_path / "absent.json") or "")
