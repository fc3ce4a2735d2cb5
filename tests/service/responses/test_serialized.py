"""A parsed request serializes as it was sent: each union member is picked by its own `type` (a kept response's
input items are dumped for GET .../input_items), where a refusal part and a tool other than a function were
serialized as another member, with pydantic's warning (and a 500 where warnings are errors)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from service.responses.schemas import ResponsesRequest


@pytest.mark.parametrize("body", [
    {"model": "m", "input": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]},
    {"model": "m", "input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                             {"type": "function_call_output", "call_id": "c1", "output": "ok"}]},
    {"model": "m", "input": "hi", "tools": [{"type": "custom", "name": "grep"}, {"type": "web_search"}]},
])
def test_a_responses_request_serializes_without_a_warning(body: dict[str, Any]) -> None:
    parsed = ResponsesRequest.model_validate(body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic: "serialized value may not be as expected"
        dumped = parsed.model_dump(exclude_none=True)
    assert ResponsesRequest.model_validate(dumped) == parsed

