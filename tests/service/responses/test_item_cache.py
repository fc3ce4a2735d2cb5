"""The items /v1/responses issued, kept for references: bounded by bytes, least recently used forgotten first."""

from __future__ import annotations

import tracemalloc
from typing import Any

from service.responses.item_cache import IssuedItems, footprint


def _item(i: int, size: int = 100) -> dict[str, str]:
    return {"id": f"msg_{i}", "text": "x" * size}


def test_items_are_kept_per_key_and_the_least_recently_used_go_first() -> None:
    cache = IssuedItems(max_bytes=3 * 600)  # three items of ~500 bytes as Python holds them
    cache.keep("k", [_item(1), _item(2), _item(3)])
    assert cache.get("k", "msg_1") == _item(1) and cache.get("other", "msg_1") is None
    cache.keep("k", [_item(4)])  # over the bound: msg_2, the least recently used, goes
    assert cache.get("k", "msg_2") is None and cache.get("k", "msg_1") is not None
    assert cache.bytes <= 3 * 600 and len(cache) == 3
    assert cache.get_sized("k", "msg_1") == (_item(1), 100)  # the characters of its text, not its labels


def test_an_item_larger_than_the_bound_is_not_kept_and_takes_nothing() -> None:
    cache = IssuedItems(max_bytes=3 * 600)
    cache.keep("k", [_item(1)])
    cache.keep("k", [_item(2, size=2000), {"no": "id"}])
    assert cache.get("k", "msg_2") is None and cache.get("k", "msg_1") is not None


def test_a_conversation_is_its_chain_of_responses_and_none_when_a_link_is_gone() -> None:
    def response(response_id: str, previous: str | None, output: list[dict[str, str]]) -> dict[str, object]:
        return {"id": response_id, "previous_response_id": previous, "output": output}

    cache = IssuedItems(max_bytes=10_000)
    cache.keep_response("k", [_item(1, 10)], response("resp_1", None, [_item(2, 10)]))
    cache.keep_response("k", [_item(3, 10)], response("resp_2", "resp_1", []))
    assert [i["id"] for i in cache.conversation("k", "resp_2") or []] == ["msg_1", "msg_2", "msg_3"]
    assert cache.conversation("other", "resp_2") is None
    cache.keep_response("k", [_item(4, 10)], response("resp_3", "resp_gone", []))
    assert cache.conversation("k", "resp_3") is None and cache.conversation("k", "msg_1") is None


def test_a_responses_input_is_its_chain_as_far_back_as_kept_then_its_own() -> None:
    # GET .../input_items lists what the response was made from; a forgotten link ends the listing, not the route.
    cache = IssuedItems(max_bytes=10_000)
    cache.keep_response("k", [_item(1, 10)], {"id": "resp_1", "previous_response_id": None, "output": [_item(2, 10)]})
    cache.keep_response("k", [_item(3, 10)], {"id": "resp_2", "previous_response_id": "resp_1", "output": []})
    cache.keep_response("k", [_item(4, 10)], {"id": "resp_3", "previous_response_id": "resp_2", "output": []})
    assert [i["id"] for i in cache.response_input("k", "resp_3") or []] == ["msg_1", "msg_2", "msg_3", "msg_4"]
    cache.forget("k", "resp_1")
    assert [i["id"] for i in cache.response_input("k", "resp_3") or []] == ["msg_3", "msg_4"]
    assert cache.response_input("k", "resp_1") is None and cache.response_input("other", "resp_3") is None


def test_the_bound_counts_what_python_holds_not_the_json_text() -> None:
    # A response of 20,000 tiny reasoning items: their JSON is a fraction of the dicts and strings holding them.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        items: list[Any] = [{"id": f"rs_{i:08d}", "type": "reasoning", "summary": []} for i in range(20_000)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    cache = IssuedItems(max_bytes=1 << 30)
    cache.keep_response("k", [], {"id": "resp_1", "previous_response_id": None, "output": items})
    assert cache.bytes >= 0.9 * held
    assert cache.stats() == {"bytes": cache.bytes, "max_bytes": 1 << 30, "entries": 1}


def test_a_long_key_counts_as_what_it_holds() -> None:
    # A hosted tool is echoed back whole, its extra keys too: a 1 MB key is a 1 MB entry.
    cache = IssuedItems(max_bytes=1 << 30)
    cache.keep_response("k", [], {"id": "resp_1", "previous_response_id": None, "output": [],
                                  "tools": [{"type": "web_search", "k" * 1_000_000: 1}]})
    assert cache.bytes >= 1_000_000


def _response(response_id: str, output: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"id": response_id, "previous_response_id": None, "output": output or []}


def test_a_kept_responses_input_items_are_referable_by_id_and_go_with_it() -> None:
    cache = IssuedItems(max_bytes=10_000)
    cache.keep_response("k", [_item(1, 10), {"type": "message", "content": "no id"}], _response("resp_1"))
    assert cache.referable("k", "msg_1") == (_item(1, 10), 10)  # the kept item itself, not a copy
    assert cache.referable("other", "msg_1") is None and cache.referable("k", "resp_1") is None
    cache.forget("k", "resp_1")
    assert cache.referable("k", "msg_1") is None and cache.bytes == 0


def test_an_output_item_wins_then_the_newest_response_sharing_an_input_id() -> None:
    cache = IssuedItems(max_bytes=10_000)
    issued = {"id": "msg_1", "type": "message", "role": "assistant", "content": "issued"}
    cache.keep("k", [issued])
    cache.keep_response("k", [{**_item(1, 10), "text": "resent"}], _response("resp_1"))
    assert cache.referable("k", "msg_1") == (issued, 6)
    cache.keep_response("k", [_item(2, 10)], _response("resp_2"))
    cache.keep_response("k", [{**_item(2, 10), "text": "newer"}], _response("resp_3"))
    assert cache.referable("k", "msg_2") == ({"id": "msg_2", "text": "newer"}, 5)
    cache.forget("k", "resp_3")  # the older response's item of that id is named again
    assert cache.referable("k", "msg_2") == (_item(2, 10), 10)


def test_an_evicted_responses_input_items_go_and_the_index_is_counted() -> None:
    # The index is counted with its response: a response of 2,000 tiny input items costs more than their dicts.
    items = [{"id": f"msg_{i:05d}"} for i in range(2_000)]
    cache = IssuedItems(max_bytes=1 << 30)
    cache.keep_response("k", items, _response("resp_1"))
    unindexed = footprint({"id": "resp_1", "type": "response", "input": items, "response": _response("resp_1")})
    assert cache.bytes >= unindexed + 2_000 * 200
    small = IssuedItems(max_bytes=2_000)
    small.keep_response("k", [_item(1, 10)], _response("resp_1"))
    small.keep_response("k", [_item(2, 10)], _response("resp_2"))
    small.keep_response("k", [_item(3, 10)], _response("resp_3"))  # over the bound: resp_1 goes, its item too
    assert small.response("k", "resp_1") is None and small.referable("k", "msg_1") is None
    assert small.referable("k", "msg_3") is not None and small.bytes <= 2_000
