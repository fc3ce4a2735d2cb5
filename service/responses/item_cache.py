"""Output items this server issued lately, by id, so a request that refers to one (`item_reference`: the Vercel AI
SDK sends earlier output so unless told `store: false`) gets it back. Bounded by bytes, the least recently used
forgotten first; kept per API key; nothing survives a restart (such a reference is then a 400 that says what to
send instead)."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

__all__ = ["IssuedItems", "ISSUED_ITEMS_BYTES"]

ISSUED_ITEMS_BYTES = 16 << 20  # 16 MiB of items' JSON: hours of an agent's turns, bounded whatever clients send


class IssuedItems:
    """(API key id, item id) → the item as the response gave it."""

    def __init__(self, max_bytes: int = ISSUED_ITEMS_BYTES) -> None:
        self._max = max_bytes
        self._items: OrderedDict[tuple[str | None, str], tuple[dict[str, Any], int]] = OrderedDict()
        self.bytes = 0

    def keep(self, tenant: str | None, items: list[dict[str, Any]]) -> None:
        """Remember a response's items (the oldest go while over the bound). Raises nothing."""
        for item in items:
            if not isinstance(item.get("id"), str):
                continue
            key = (tenant, item["id"])
            size = len(json.dumps(item, ensure_ascii=False))
            if key in self._items:
                self.bytes -= self._items.pop(key)[1]
            if size > self._max:
                continue
            self._items[key] = (item, size)
            self.bytes += size
        while self.bytes > self._max:
            _, (_, size) = self._items.popitem(last=False)
            self.bytes -= size

    def get(self, tenant: str | None, item_id: str) -> dict[str, Any] | None:
        """The item, or None when it was never issued to this key or has been forgotten. Raises nothing."""
        found = self._items.get((tenant, item_id))
        if found is None:
            return None
        self._items.move_to_end((tenant, item_id))
        return found[0]

    def __len__(self) -> int:
        return len(self._items)
