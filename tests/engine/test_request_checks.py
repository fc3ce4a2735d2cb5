"""engine/request_checks.py: what a generation request must satisfy before it may queue."""

from __future__ import annotations

from typing import Any

import pytest

from engine.contracts import GenerationRequest, GrammarSpec, SamplingParams
from engine.errors import InvalidRequest
from engine.request_checks import check_request


def _check(**fields: Any) -> list[int]:
    return check_request(GenerationRequest([1, 2], **fields), vocab_size=10, context_length=1000)


def test_min_tokens_and_ignore_eos_pass_without_a_grammar() -> None:
    assert _check(min_tokens=5, ignore_eos=True, max_tokens=3) == [1, 2]  # past max_tokens: the row fits it


@pytest.mark.parametrize("fields, param", [
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 2, "sampling": SamplingParams(grammar=GrammarSpec(text="start: /x+/"))}, "min_tokens"),
    ({"ignore_eos": True, "sampling": SamplingParams(grammar=GrammarSpec(text=None, calls="start: /x/"))},
     "ignore_eos"),
])
def test_what_no_row_can_honour_is_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    # A grammar ends its reply with an end-of-sequence token: held back, a finished reply could take no token.
    with pytest.raises(InvalidRequest) as refused:
        _check(**fields)
    assert refused.value.param == param
