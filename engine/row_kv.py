"""RowKV — where each row's KV lives while the engine steps it: a per-row cache (fresh, or a prefix-cache hit) while
its prompt is fed, a slot of the SlotKV buffers once it decodes, and the prefix cache when it leaves (cut to the
tokens it fed), and at its prompt's segment boundaries. A cache that cannot be cut back is put where its prompt chunks
stop (`Row.stops`). Engine threads only; what each call did is noted on the calling thread's step record."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from engine.contracts import GenerationRequest
from engine.kv_snapshot import trimmable_through
from engine.prefix_cache import PrefixCache
from engine.rows import Row
from engine.runner import make_cache
from engine.slots import SlotKV
from engine.step_record import StepRecord

__all__ = ["RowKV", "repeatable", "wrote"]

_log = logging.getLogger(__name__)


class RowKV:
    """The rows' caches and slots, and their way into the prefix cache. `record` gives the calling thread's step
    record (engine/step.py keeps one per engine thread)."""

    def __init__(self, model: Any, slots: SlotKV | None, prefix_cache: PrefixCache | None,
                 record: Callable[[], StepRecord]) -> None:
        self.model = model
        self.slots = slots
        self.prefix_cache = prefix_cache
        self._record = record

    def size_slots(self, rows: list[Row]) -> None:
        """Cap slot growth at what the rows reserved, and shrink the buffers to the rows left once they hold twice
        what those need. With a step in flight too: its rows have their slots and lengths already (a forward
        commits them as it is built), and renumbering keeps their order, so its tokens still feed the next step."""
        slots = self.slots
        if slots is None:
            return
        slots.ceiling = max((len(r.prompt) + r.request.max_tokens + 1 for r in rows), default=None)
        holders = {r.slot: r for r in rows if r.slot is not None}
        if slots.oversized() and set(holders) == set(slots.lengths):  # every slot's row is here to renumber
            self._record().note("compact")
            for old, new in slots.compact().items():
                holders[old].slot = new

    def attach(self, row: Row) -> None:
        """Give a new row its cache: a prefix-cache hit (its prompt then starts after the hit) or a fresh one.
        Raises nothing from the prefix cache: a cache problem costs a cold prefill, never the request."""
        self._record().note("attach")
        # A row scoring its prompt needs every position's logits: a hit would skip them.
        if self.prefix_cache is not None and not repeatable(row.request) and row.scores is None:
            try:
                n, kv = self.prefix_cache.take(row.request.namespace, row.prompt, row.request.session_id)
            except Exception:  # a cache problem costs a cold prefill, never the request
                _log.exception("prefix cache take failed")
                n, kv = 0, None
            if kv is not None and 0 < n < len(row.prompt):
                row.cache, row.prefilled, row.cached_tokens = list(kv), n, n
        if row.cache is None:
            row.cache = make_cache(self.model)
        row.stops = self._stops(row)

    def _stops(self, row: Row) -> list[int]:
        """Where the row's prompt chunks end so that a cache that cannot be cut back (a sliding window that will have
        wrapped by the end of its reply, a recurrent state) gets its prefix-cache entries: an entry of the whole reply
        serves only prompts that repeat it token for token. Its segment boundaries (the system prompt), and its
        prompt's last position, which a repeat of the prompt and a next turn whose template renders the reply
        otherwise than it was generated both read (llama.cpp's SWA checkpoints likewise). Raises nothing."""
        if self.prefix_cache is None or row.cache is None \
                or trimmable_through(row.cache, len(row.prompt) + row.request.max_tokens):
            return []
        return sorted({b for b in (*row.boundaries, len(row.prompt) - 1) if row.prefilled < b <= row.prompt_end})

    def boundary_puts(self, row: Row, before: int) -> None:
        """Put the row's prompt prefixes at the segment boundaries and stops its last chunk (fed from `before`)
        passed; a stop that is no boundary (the prompt's end) is a conversation's, not a system prefix."""
        if self.prefix_cache is None or row.cache is None:
            return
        for b in sorted({*row.boundaries, *row.stops}):
            if before < b <= row.prefilled:
                self._record().note("put")
                wrote(row, self.prefix_cache.put(row.request.namespace, row.prompt[:b], row.cache,
                                                 row.request.session_id, system_prefix=b in row.boundaries))

    def keeps(self, row: Row) -> bool:
        """Whether a departing row's KV is worth a prefix-cache put. Raises nothing."""
        return self.prefix_cache is not None and (row.cache is not None or row.slot is not None) and row.prefilled > 0

    def put(self, row: Row) -> None:
        """Hand a row's KV to the prefix cache (cut to the tokens it fed), then free its cache or slot.
        Raises nothing: a cache problem never fails the request."""
        if self.prefix_cache is not None and self.keeps(row):
            record = self._record()
            t = time.perf_counter()
            try:
                fed = row.fed_tokens()  # a speculative step may have written one more position: cut it
                kv = row.cache if row.slot is None or self.slots is None else self.slots.export(row.slot, len(fed))
                if kv is not None:
                    record.note("put")
                    stored = self.prefix_cache.put(row.request.namespace, fed, kv, row.request.session_id)
                    # Written is what a later prompt sharing this one can read: past the prompt, an entry that cannot
                    # be cut back serves only a prompt repeating the reply token for token (its stops' entries count).
                    if len(fed) <= len(row.prompt) or all(layer.is_trimmable() for layer in kv):
                        wrote(row, stored)  # before the final delta is built: usage reads it
            except Exception:  # a cache problem must never fail the request
                _log.exception("prefix cache put failed")
            record.tick("put", t)
        self.release(row)

    def release(self, row: Row) -> None:
        """Free a row's per-row cache or slot. Raises nothing."""
        if row.slot is not None and self.slots is not None:
            self.slots.release(row.slot)
        row.cache, row.slot = None, None


def repeatable(request: GenerationRequest) -> bool:
    """A seeded sampled request, whose reply should repeat on an idle server: it prefills its whole prompt, since
    a prefix hit changes the forward's shape and with it the logits' last bits (a probe: 1 prompt in 8 sampled
    otherwise after an earlier prompt shared its start). Raises nothing."""
    return request.sampling.seed is not None and request.sampling.temperature > 0


def wrote(row: Row, stored: range) -> None:
    """Count the prompt positions a prefix-cache put newly stored as the row's writes (usage's cache_write_tokens):
    whether or not it read from the cache, the tokens it held already are no write. Raises nothing."""
    fresh = len(range(stored.start, min(stored.stop, len(row.prompt))))
    row.cache_written = min(len(row.prompt), row.cache_written + fresh)  # an evicted boundary entry put again
