"""schemathesis over the app's own OpenAPI document, in-process: whatever the schema allows, the server
answers without a 5xx, with a documented status, content type, headers and body (SSE events included)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.app import create_app
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.fake_engine import FakeEngine

# The committed document; `tandem openapi --check` (tests/service/cli) keeps it equal to the app's.
DOCUMENT = Path(__file__).parents[2] / "openapi" / "openapi.json"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from schemathesis.python.asgi import shutdown_lifespans

    whisper = build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))
    # Scripted chat beside a real task loop for speech, and a real tiny Whisper.
    state = install_speech(AppState(engine=FakeEngine(run_tasks=True)), SpeechConfig(model=str(whisper), resident=True))
    yield schemathesis.openapi.from_asgi("/docs/openapi.json", create_app(state))
    shutdown_lifespans()  # schemathesis ran the app's lifespan: stop its engine and speech loops


def _operations() -> list[tuple[str, str]]:
    document = json.loads(DOCUMENT.read_text())
    return [(method.upper(), path) for path, item in document["paths"].items() for method in item
            if method in ("get", "post", "put", "patch", "delete")]


OPERATIONS = _operations()


# One test per operation, each running many generated cases (schemathesis's lazy pytest loader does not run
# under this pytest, so hypothesis drives the operation's strategy directly).
@pytest.mark.parametrize("method,path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_the_api_conforms_to_its_schema(api_schema: Any, method: str, path: str) -> None:
    operation = api_schema[path][method]

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=operation.as_strategy())
    def conforms(case: Any) -> None:
        case.call_and_validate(checks=CHECKS)

    conforms()


def test_the_schema_documents_streams_as_events() -> None:
    document = json.loads(DOCUMENT.read_text())
    stream = document["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]
    data = stream["schema"]["properties"]["data"]
    assert {"const": "[DONE]"} in data["anyOf"]
    assert any(b.get("contentMediaType") == "application/json" for b in data["anyOf"])
    audio = document["paths"]["/v1/audio/sessions/{session_id}/audio"]["post"]["requestBody"]["content"]
    assert any(media.startswith("audio/pcm") for media in audio)
