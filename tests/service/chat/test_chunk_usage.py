"""service/chat/chunk_usage.py: vLLM's stream_options.continuous_usage_stats, as guidellm sends it with every
streamed chat and text completion: each chunk carries its choice's usage so far, the usage chunk still last."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.service.conftest import sse_events

USER = [{"role": "user", "content": "hi"}]
GUIDELLM = {"include_usage": True, "continuous_usage_stats": True}  # guidellm 0.8.1's, on every streamed request


def _stream(client: Any, path: str, body: dict[str, Any], options: dict[str, Any]) -> list[dict[str, Any]]:
    response = client.post(path, json={**body, "stream": True, "stream_options": options})
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    return events[:-1]


def _grows(usages: list[dict[str, Any]]) -> None:
    counts = [u["completion_tokens"] for u in usages]
    assert counts == sorted(counts) and counts[0] < counts[-1], counts
    assert len({u["prompt_tokens"] for u in usages}) == 1
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": USER}),
    ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 1}),
    ("/v1/completions", {"prompt": "abc"}),
    ("/v1/completions", {"prompt": "abc", "echo": True, "logprobs": 1}),
])
def test_every_chunk_carries_the_usage_so_far_up_to_the_final(client: Any, path: str, body: dict[str, Any]) -> None:
    *chunks, final = _stream(client, path, body, GUIDELLM)
    assert final["choices"] == [] and all(c["choices"] for c in chunks)
    usages = [c["usage"] for c in chunks]
    assert None not in usages
    _grows(usages)
    assert usages[-1] == final["usage"]  # the finish chunk's usage is the request's


@pytest.mark.parametrize("path, body, prompts", [
    ("/v1/chat/completions", {"messages": USER, "n": 2}, None),
    ("/v1/completions", {"prompt": ["ab", "cde"], "n": 2}, [2, 2, 3, 3]),
])
def test_with_several_choices_each_counts_its_own_as_vllms(client: Any, path: str, body: dict[str, Any],
                                                           prompts: list[int] | None) -> None:
    *chunks, final = _stream(client, path, body, GUIDELLM)
    by_choice: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for chunk in chunks:
        by_choice[chunk["choices"][0]["index"]].append(chunk["usage"])
    for usages in by_choice.values():
        _grows(usages)
    lasts = [by_choice[index][-1] for index in sorted(by_choice)]
    if prompts is not None:  # each choice its own prompt's tokens
        assert [u["prompt_tokens"] for u in lasts] == prompts
    # The usage chunk sums the replies, each prompt counted once.
    assert final["usage"]["completion_tokens"] == sum(u["completion_tokens"] for u in lasts)
    assert final["usage"]["prompt_tokens"] == sum(sorted({u["prompt_tokens"] for u in lasts}))


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {"messages": USER}),
                                        ("/v1/completions", {"prompt": "abc"})])
@pytest.mark.parametrize("options", [{"include_usage": True, "continuous_usage_stats": False},
                                     {"continuous_usage_stats": True}, {"continuous_usage_stats": None}])
def test_false_or_without_include_usage_it_asks_for_nothing_more(client: Any, path: str, body: dict[str, Any],
                                                                  options: dict[str, Any]) -> None:
    # vLLM ignores continuous_usage_stats without include_usage.
    events = _stream(client, path, body, options)
    if options.get("include_usage"):
        *events, final = events
        assert final["choices"] == [] and final["usage"]["completion_tokens"] > 0
        assert all("usage" in e and e["usage"] is None for e in events)
    else:
        assert all(e["choices"] and "usage" not in e for e in events)


def test_a_continuous_usage_stats_not_a_switch_is_refused_by_name(client: Any) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "stream": True,
                                                         "stream_options": {"continuous_usage_stats": "yes"}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream_options.continuous_usage_stats"


@pytest.mark.parametrize("body", [{"messages": USER}, {"messages": USER, "n": 2}])
def test_the_role_chunk_counts_no_completion_tokens_as_vllms_first(client: Any, body: dict[str, Any]) -> None:
    # It said 1, as did the first content chunk after it: a token counted before anything was generated is shown.
    chunks = _stream(client, "/v1/chat/completions", body, GUIDELLM)
    for index in range(body.get("n", 1)):
        role, first, *_ = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert role["usage"]["completion_tokens"] == 0 and role["usage"]["total_tokens"] == role["usage"]["prompt_tokens"]
        assert first["choices"][0]["delta"]["content"] and first["usage"]["completion_tokens"] == 1
