"""KVAdmission — which rows the memory budget lets run together, and which can never run.

A row's worst case is what admission reserves. Where decode rows share SlotKV's buffers (the packed runner): once
decoding, every row sits in a slot as long as the longest row may grow (SlotKV pads slots to a power of two and
positions to its step), and a row still prefilling also holds a per-row cache of its prompt (mlx-lm's KVCache,
256-position steps). Elsewhere each row keeps its own caches throughout: its prompt + max_tokens positions, and up to a
growth step more (a cache grows a step past what a chunk needs). Those positions are charged the bytes a token takes in
the layers that keep every token; a row's sliding windows and recurrent states (engine/kv_shape.py), bounded whatever
its length, are charged once a row on top.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from engine.contracts import GenerationRequest
from engine.errors import MemoryAdmission
from engine.kv_shape import GROWTH_STEP
from engine.memory import MemoryBudget
from engine.rows import Row

__all__ = ["KVAdmission", "admissible", "may_join"]

_PREFILL_STEP = GROWTH_STEP  # mlx-lm's KVCache grows in steps of 256 positions
_UNBOUNDED = 1 << 40  # positions a row may reach when no layer grows with tokens (every cache a fixed state)


def _round(n: int, step: int) -> int:
    return -(-n // step) * step


class KVAdmission:
    """Projected KV bytes of a set of rows against `budget.kv` (see module doc). `slot_step`: SlotKV's position step
    where decode rows move into its slots; None where rows keep their own caches."""

    def __init__(self, budget: MemoryBudget, slot_step: int | None = 256) -> None:
        self.budget = budget
        self.slot_step = slot_step

    def projected_bytes(self, rows: Sequence[Row]) -> int:
        """The most KV memory `rows` can need together. Raises nothing."""
        if not rows:
            return 0
        shape = self.budget.kv_shape
        lengths = [len(r.prompt) + r.request.max_tokens + 1 for r in rows]
        bounded = sum(shape.bounded_bytes(n) for n in lengths)
        if self.slot_step is None:
            return shape.token_bytes * sum(n + GROWTH_STEP for n in lengths) + bounded
        slots = 1 << max(0, len(rows) - 1).bit_length()
        preparing = sum(_round(len(r.prompt), _PREFILL_STEP) for r in rows if r.prefilled < len(r.prompt))
        return shape.token_bytes * (slots * _round(max(lengths), self.slot_step) + preparing) + bounded

    def fits(self, rows: Sequence[Row]) -> bool:
        """Whether `rows` may run together. Raises nothing."""
        return self.projected_bytes(rows) <= self.budget.kv

    def room(self, prompt: int) -> int:
        """New tokens that fit after a `prompt`-token prompt running alone, beside its full windows and states: one
        slot of (prompt + max_tokens + 1) step-rounded positions plus its prefill cache, or its own caches' positions
        and a growth step. Raises nothing."""
        held = self._tokens_held()
        if held < 0 or not self.budget.kv_token_bytes:  # no room for its states, or no layer grows with tokens
            return -1 if held < 0 else _UNBOUNDED - prompt
        if self.slot_step is None:
            return held - GROWTH_STEP - 1 - prompt
        positions = (held - _round(prompt, _PREFILL_STEP)) // self.slot_step * self.slot_step - 1
        return positions - prompt

    def _tokens_held(self) -> int:
        """Positions of the growing layers the budget holds beside one row's bounded layers (-1: not even those)."""
        shape = self.budget.kv_shape
        left = self.budget.kv - shape.row_bytes
        if left < 0:
            return -1
        return left // shape.token_bytes if shape.token_bytes else _UNBOUNDED

    def longest_prompt(self) -> int:
        """The longest prompt that can run alone with one new token (with slots, its KV is held twice while it is
        read: the prefill cache and the slot). Raises nothing."""
        lo, hi = 0, max(0, self._tokens_held())
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
            kv, fixed = self.budget.kv, self.budget.kv_shape.row_bytes
            holds = f"the server's budget holds {max(0, self._tokens_held())} tokens of KV in {kv >> 20} MiB" + (
                f" beside the {fixed / (1 << 20):,.1f} MiB a row's sliding windows and recurrent states take"
                if fixed else "")
            if room > 0:
                raise MemoryAdmission(
                    f"prompt ({prompt} tokens) + max_tokens ({request.max_tokens}) needs more KV memory than "
                    f"{holds}; at most {room} new tokens fit after this prompt", code="context_over_budget",
                    param="max_tokens")
            twice = ", and a prompt's KV is held twice while it is read (its prefill cache and its decode slot)" \
                if self.slot_step is not None else ""
            raise MemoryAdmission(
                f"the prompt ({prompt} tokens) does not fit the memory budget: {holds}{twice}, so at most "
                f"{self.longest_prompt()} prompt tokens fit", code="context_over_budget", param="prompt")
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
