"""KVAdmission — which rows the memory budget lets run together, and which can never run.

A row's worst case is what admission reserves: once decoding, every row sits in a slot as long as the
longest row may grow (SlotKV pads slots to a power of two and positions to its step), and a row still
prefilling also holds a per-row cache of its prompt (mlx-lm's KVCache, 256-position steps).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from engine.contracts import GenerationRequest
from engine.errors import MemoryAdmission
from engine.memory import MemoryBudget
from engine.rows import Row

__all__ = ["KVAdmission", "admissible", "may_join"]

_PREFILL_STEP = 256  # mlx-lm's KVCache grows in steps of 256 positions


def _round(n: int, step: int) -> int:
    return -(-n // step) * step


class KVAdmission:
    """Projected KV bytes of a set of rows against `budget.kv` (see module doc)."""

    def __init__(self, budget: MemoryBudget, slot_step: int = 256) -> None:
        self.budget = budget
        self.slot_step = slot_step

    def projected_bytes(self, rows: Sequence[Row]) -> int:
        """The most KV memory `rows` can need together. Raises nothing."""
        if not rows:
            return 0
        longest = max(len(r.prompt) + r.request.max_tokens + 1 for r in rows)
        slots = 1 << max(0, len(rows) - 1).bit_length()
        preparing = sum(_round(len(r.prompt), _PREFILL_STEP) for r in rows if r.prefilled < len(r.prompt))
        return self.budget.kv_token_bytes * (slots * _round(longest, self.slot_step) + preparing)

    def fits(self, rows: Sequence[Row]) -> bool:
        """Whether `rows` may run together. Raises nothing."""
        return self.projected_bytes(rows) <= self.budget.kv

    def room(self, prompt: int) -> int:
        """New tokens that fit after a `prompt`-token prompt running alone: one slot of (prompt + max_tokens + 1)
        step-rounded positions, plus its prefill cache. Raises nothing."""
        positions = (self.budget.kv // self.budget.kv_token_bytes - _round(prompt, _PREFILL_STEP)) \
            // self.slot_step * self.slot_step - 1
        return positions - prompt

    def longest_prompt(self) -> int:
        """The longest prompt that can run alone with one new token (its KV is held twice while it is read: the
        prefill cache and the slot). Raises nothing."""
        lo, hi = 0, self.budget.kv // self.budget.kv_token_bytes
        while lo < hi:  # room() falls as the prompt grows
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.room(mid) >= 1 else (lo, mid - 1)
        return lo

    def longest_request(self) -> int:
        """The most tokens (prompt + max_tokens) a request running alone may have, however it splits them: every
        prompt up to longest_prompt() keeps at least one more position than itself. Raises nothing."""
        return self.longest_prompt() + 1

    def fit(self, request: GenerationRequest, prompt: int) -> GenerationRequest:
        """`request` as it can run alone: a defaulted max_tokens lowered to what fits after the prompt.
        Raises MemoryAdmission (code context_over_budget) when even that cannot fit: naming `max_tokens` when a
        smaller one would fit, `prompt` when the prompt alone does not."""
        room = self.room(prompt)
        if not request.max_tokens_requested and room >= 1:
            return replace(request, max_tokens=room) if request.max_tokens > room else request
        if request.max_tokens > room:
            kv = self.budget.kv
            holds = f"the server's budget holds {kv // self.budget.kv_token_bytes} tokens of KV in {kv >> 20} MiB"
            if room > 0:
                raise MemoryAdmission(
                    f"prompt ({prompt} tokens) + max_tokens ({request.max_tokens}) needs more KV memory than "
                    f"{holds}; at most {room} new tokens fit after this prompt", code="context_over_budget",
                    param="max_tokens")
            raise MemoryAdmission(
                f"the prompt ({prompt} tokens) does not fit the memory budget: {holds}, and a prompt's KV is held "
                f"twice while it is read (its prefill cache and its decode slot), so at most {self.longest_prompt()} "
                "prompt tokens fit", code="context_over_budget", param="prompt")
        return request


def may_join(row: Row, active: Sequence[Row], *, max_kv_tokens: int | None, admission: KVAdmission | None) -> bool:
    """Whether a queued row may join the active ones: a lone row always may; otherwise the rows' prompt +
    max_tokens must stay within `max_kv_tokens` and their projected KV within the memory budget. Raises nothing."""
    if not active:
        return True
    rows = [*active, row]
    if max_kv_tokens is not None and sum(len(r.prompt) + r.request.max_tokens for r in rows) > max_kv_tokens:
        return False
    return admission is None or admission.fits(rows)


def admissible(queue: Iterable[Row], active: Sequence[Row], *, max_active: int, max_kv_tokens: int | None,
               admission: KVAdmission | None) -> list[Row]:
    """The queued rows the next admission pass takes, in order: while a row is free and each one's KV fits beside
    the rows before it (`may_join`); cancelled rows are passed over. Raises nothing."""
    running, taken = list(active), []
    for row in queue:
        if len(running) >= max_active:
            break
        if row.cancelled:
            continue
        if not may_join(row, running, max_kv_tokens=max_kv_tokens, admission=admission):
            break  # its KV does not fit next to the running rows: it and those behind it wait for one to leave
        running.append(row)
        taken.append(row)
    return taken
