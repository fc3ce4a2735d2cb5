"""Output items and responses this server issued lately, by id: a request that refers to an item (`item_reference`:
the Vercel AI SDK sends earlier output so unless told `store: false`) gets it back, and one that continues a response
(`previous_response_id`) gets the conversation so far (each stored response keeps its own input and output and the
id of the one it continued). A kept response's input items are referable too, by the ids GET .../input_items lists
them by: an index from each id to its response and position, so nothing is copied and an item goes with its response.
Bounded by bytes, the least recently used forgotten first; kept per API key; nothing survives a restart (a reference
is then a 400 that says what to send instead)."""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any

__all__ = ["IssuedItems", "ISSUED_ITEMS_BYTES", "footprint"]

ISSUED_ITEMS_BYTES = 16 << 20  # 16 MiB of items as Python holds them: hours of an agent's turns, whatever is sent

# What indexing one input item holds beside the item (its key and entry tuples, the list, a dict slot), counted with
# its response: 20,000 tiny input items would otherwise index uncounted.
_INDEX_BYTES = 2 * sys.getsizeof((None, None)) + sys.getsizeof([None]) + 64


class IssuedItems:
    """(API key id, item id) → the item as the response gave it."""

    def __init__(self, max_bytes: int = ISSUED_ITEMS_BYTES) -> None:
        self._max = max_bytes
        # (tenant, id) → (item, bytes it counts for, characters of text it holds)
        self._items: OrderedDict[tuple[str | None, str], tuple[dict[str, Any], int, int]] = OrderedDict()
        # (tenant, input item id) → (response id, the item's place in its input) of each kept response whose own
        # input holds it, oldest first: an id a client re-sends in several responses names the newest's.
        self._inputs: dict[tuple[str | None, str], list[tuple[str, int]]] = {}
        self.bytes = 0

    def keep(self, tenant: str | None, items: list[dict[str, Any]]) -> None:
        """Remember a response's items (the oldest go while over the bound). Raises nothing."""
        for item in items:
            if not isinstance(item.get("id"), str):
                continue
            key = (tenant, item["id"])
            size = footprint(item) + _INDEX_BYTES * len(_input_ids(item))
            if key in self._items:
                self._drop(key)
            if size > self._max:
                continue
            self._items[key] = (item, size, _text_chars(item))
            self.bytes += size
            for at, item_id in _input_ids(item):
                self._inputs.setdefault((tenant, item_id), []).append((item["id"], at))
        while self.bytes > self._max:
            self._drop(next(iter(self._items)))

    def _drop(self, key: tuple[str | None, str]) -> None:
        """Forget a kept entry, and a response's input items with it. Raises nothing."""
        item, size, _ = self._items.pop(key)
        self.bytes -= size
        for at, item_id in _input_ids(item):
            places = self._inputs.get((key[0], item_id), [])
            if (key[1], at) in places:
                places.remove((key[1], at))
            if not places:
                self._inputs.pop((key[0], item_id), None)

    def keep_response(self, tenant: str | None, input_items: list[dict[str, Any]], response: dict[str, Any]) -> None:
        """Remember a response: its own input and the Response object it finished as (its id, output and the id
        it continued). Raises nothing."""
        self.keep(tenant, [{"id": response["id"], "type": "response", "input": input_items, "response": response}])

    def response(self, tenant: str | None, response_id: str) -> dict[str, Any] | None:
        """The Response object of a kept response, or None. Raises nothing."""
        record = self.get(tenant, response_id)
        return record.get("response") if record is not None and record.get("type") == "response" else None

    def forget(self, tenant: str | None, item_id: str) -> None:
        """Drop an item or response (a chain through it ends there). Raises nothing."""
        if (tenant, item_id) in self._items:
            self._drop((tenant, item_id))

    def conversation(self, tenant: str | None, response_id: str) -> list[dict[str, Any]] | None:
        """Every item from the first response of the chain that ends with `response_id` up to its output, or None
        when a response of the chain is not kept. Raises nothing."""
        chain: list[list[dict[str, Any]]] = []
        seen: set[str] = set()
        at: str | None = response_id
        while at is not None:
            record = self.get(tenant, at)
            if record is None or record.get("type") != "response" or at in seen:
                return None
            seen.add(at)
            response = record["response"]
            chain.append(record["input"] + response["output"])
            at = response["previous_response_id"]
        return [item for items in reversed(chain) for item in items]

    def missing_link(self, tenant: str | None, response_id: str) -> str | None:
        """The first response of the chain ending with `response_id` that is not kept (forgotten or deleted), or None
        when all are. Raises nothing."""
        seen: set[str] = set()
        at: str | None = response_id
        while at is not None and at not in seen:
            seen.add(at)
            record = self._items.get((tenant, at))
            if record is None or record[0].get("type") != "response":
                return at
            at = record[0]["response"]["previous_response_id"]
        return None

    def response_input(self, tenant: str | None, response_id: str) -> list[dict[str, Any]] | None:
        """The items a kept response was made from, oldest first: the conversation it continued (as far back as
        its chain is still kept) and its own input; None when the response is not kept. Raises nothing."""
        record = self.get(tenant, response_id)
        if record is None or record.get("type") != "response":
            return None
        chain: list[list[dict[str, Any]]] = [record["input"]]
        seen = {response_id}
        at = record["response"]["previous_response_id"]
        while at is not None and at not in seen:
            earlier = self.get(tenant, at)
            if earlier is None or earlier.get("type") != "response":
                break  # forgotten or deleted: the conversation is listed from the turn after it
            seen.add(at)
            chain.append(earlier["input"] + earlier["response"]["output"])
            at = earlier["response"]["previous_response_id"]
        return [item for items in reversed(chain) for item in items]

    def get(self, tenant: str | None, item_id: str) -> dict[str, Any] | None:
        """The item, or None when it was never issued to this key or has been forgotten. Raises nothing."""
        found = self.get_sized(tenant, item_id)
        return found[0] if found is not None else None

    def get_sized(self, tenant: str | None, item_id: str) -> tuple[dict[str, Any], int] | None:
        """The item and the characters of text it holds, or None. Raises nothing."""
        found = self._items.get((tenant, item_id))
        if found is None:
            return None
        self._items.move_to_end((tenant, item_id))
        return found[0], found[2]

    def referable(self, tenant: str | None, item_id: str) -> tuple[dict[str, Any], int] | None:
        """What an `item_reference` to `item_id` names, with the characters of text it holds, or None: an output item
        this server issued under that id, else the input item of that id of the newest kept response whose own input
        holds one (its response counts as used). Raises nothing."""
        found = self._items.get((tenant, item_id))
        if found is not None and found[0].get("type") != "response":
            self._items.move_to_end((tenant, item_id))
            return found[0], found[2]
        places = self._inputs.get((tenant, item_id))
        if not places:
            return None
        response_id, at = places[-1]
        record = self.get(tenant, response_id)  # kept: a response's places go with it
        item = record["input"][at] if record is not None else None
        return (item, _text_chars(item)) if item is not None else None

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, int]:
        """What /stats shows of the store. Raises nothing."""
        return {"bytes": self.bytes, "max_bytes": self._max, "entries": len(self._items)}


def footprint(value: Any) -> int:
    """Bytes Python holds for a JSON value, its containers included: counting the JSON text alone let 20,000 tiny
    items take 3.6x the bound (each small dict costs more than its text). Iterative: any depth. Raises nothing."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        total += sys.getsizeof(item)
        if isinstance(item, dict):  # keys too: a hosted tool echoed back may carry any key, of any length
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _input_ids(record: dict[str, Any]) -> list[tuple[int, str]]:
    """(place, id) of each input item of a kept response record with a string id; none for anything else."""
    if record.get("type") != "response":
        return []
    return [(at, item["id"]) for at, item in enumerate(record.get("input") or ()) if isinstance(item.get("id"), str)]


# Keys whose strings label an item rather than say something to the model.
_LABELS = frozenset({"id", "type", "status", "call_id", "role", "phase"})


def _text_chars(value: Any) -> int:
    """Characters of the strings a JSON value holds (what it adds to a prompt, at most). Raises nothing."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for k, v in value.items() if k not in _LABELS)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    return 0
