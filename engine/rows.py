"""A row of the LLM batch group, its lifecycle state, and the delta stream its consumer iterates (closing the
stream cancels the row)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from engine.constraints import Constraint
from engine.contracts import Delta, FinishReason, GenerationRequest, TokenLogprob
from engine.prompt_scores import LogitsOf, PromptScores
from engine.sampling import RowSampler
from engine.stop_matcher import StopMatcher
from engine.xtc import xtc_special_tokens

__all__ = ["AGED", "Row", "RowState", "LLMRowStream", "plan_iteration", "prefill_shares"]

# Iterations a prompt may be passed over before it goes first (~4 s of 2-core CPU mixed iterations): eight agents'
# cached turns, each shorter than an uncached first turn, kept those waiting ~390 s.
AGED = 32


class RowState(Enum):
    """Where a row is in its life. QUEUED → ACTIVE (prefilling, then decoding: see Row.preparing/decoding)
    → FINISHED (stop, length, error, engine closed) or CANCELLED (its consumer went away)."""

    QUEUED = "queued"
    ACTIVE = "active"
    FINISHED = "finished"
    CANCELLED = "cancelled"


@dataclass(eq=False)
class Row:
    """One generation inside the group. `prefilled` counts prompt tokens whose KV is in `cache` (or `slot`)."""

    request: GenerationRequest
    send: MemoryObjectSendStream[Delta]
    sampler: RowSampler
    stopper: StopMatcher
    prompt: list[int]
    cache: list[Any] | None = None  # per-row KV while preparing; None once the KV moved to `slot`
    slot: int | None = None  # the runner's SlotKV slot holding this decoding row's KV
    state: RowState = RowState.QUEUED
    prefilled: int = 0
    cached_tokens: int = 0
    # Its prompt tokens its prefix-cache puts newly stored, the cache not holding them already (engine/row_kv.py):
    # usage's cache_write_tokens.
    cache_written: int = 0
    last_token: int | None = None  # sampled but not yet fed: the next decode input
    # Its next token is sampled by a launched step not read yet (engine/pipeline.py): it decodes next, fed lazily.
    token_in_flight: bool = False
    # Its prompt chunk runs on the prefill lane now (engine/lane.py): no other thread touches it until it lands.
    in_lane: bool = False
    generated: list[int] = field(default_factory=list)
    unsent_ids: list[int] = field(default_factory=list)
    # Log probabilities not yet sent, each with where its token's text ends (engine/stop_matcher.py's position; inf
    # for the token a stop string cut).
    unsent_logprobs: list[tuple[float, TokenLogprob]] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=list)
    # Where its prompt chunks end besides `prompt_end`, ascending: a cache that cannot be cut back (a wrapped sliding
    # window, a recurrent state) is put into the prefix cache only at a chunk's end (engine/row_kv.py sets them).
    stops: list[int] = field(default_factory=list)
    # Planned iterations in which a younger prompt got tokens and this one none (`prefill_shares`): past AGED it goes
    # before shorter prompts, which a stream of short ones otherwise kept ahead of it for good.
    passed_over: int = 0
    # Its prompt's last token is fed by its first decode step, not the prefill lane (engine/lane.py): the lane's
    # join wait then comes before its first token, and its second follows one decode step later.
    decode_tail: bool = False
    # Its prompt's log probabilities, as its chunks are fed (asked for: GenerationRequest.prompt_logprobs), then
    # read at its first token and held until a delta carries them.
    scores: PromptScores | None = None
    unsent_prompt_logprobs: list[TokenLogprob] | None = None

    @classmethod
    def start(cls, request: GenerationRequest, prompt: list[int], *, vocab_size: int, tokenizer: Any,
              decode_tail: bool = False, constraint: Constraint | None = None
              ) -> tuple["Row", MemoryObjectReceiveStream[Delta]]:
        """A queued row for a checked request (engine/request_checks.py) and the receiving end of its deltas,
        unbounded so a slow consumer never blocks the loop. `decode_tail`: see the field (prompts of 2+ tokens);
        `constraint`: the grammar its reply follows (engine/constraints.py).
        Raises nothing of its own."""
        send, receive = anyio.create_memory_object_stream[Delta](math.inf)
        xtc = request.sampling.xtc_probability > 0 and request.sampling.temperature > 0
        min_tokens = min(request.min_tokens, request.max_tokens)  # a max_tokens the engine lowered bounds it too
        # vLLM's min_tokens holds the end-of-sequence ids back even beside ignore_eos, and the stop ids.
        ends = {*request.stop_token_ids, *(getattr(tokenizer, "eos_token_ids", None) or ())} if min_tokens else ()
        sampler = RowSampler(request.sampling, prompt, vocab_size, constraint,
                             xtc_special=xtc_special_tokens(tokenizer) if xtc else (), ends=ends, min_tokens=min_tokens)
        row = cls(request=request, send=send, sampler=sampler,
                  stopper=StopMatcher(tokenizer, stop=request.stop, stop_token_ids=request.stop_token_ids,
                                      max_tokens=request.max_tokens, keep_leading_space=request.continuation,
                                      skip_special_tokens=request.skip_special_tokens, min_tokens=min_tokens,
                                      ignore_eos=request.ignore_eos, continued=prompt if request.continuation else ()),
                  prompt=prompt, boundaries=sorted(b for b in request.segment_boundaries if 0 < b < len(prompt)),
                  decode_tail=decode_tail and len(prompt) > 1)
        if request.prompt_logprobs is not None:
            row.scores = PromptScores(prompt, request.prompt_logprobs)
        return row, receive

    @property
    def finished(self) -> bool:
        """Ended by the engine (stop, length, error, close)."""
        return self.state is RowState.FINISHED

    @property
    def cancelled(self) -> bool:
        """Abandoned by its consumer; the group prunes it (and frees its KV) before the next step."""
        return self.state is RowState.CANCELLED

    @property
    def ended(self) -> bool:
        return self.state in (RowState.FINISHED, RowState.CANCELLED)

    @property
    def prompt_end(self) -> int:
        """Where its prefill stops: before the last token when a decode step feeds that (`decode_tail`)."""
        return len(self.prompt) - 1 if self.decode_tail else len(self.prompt)

    @property
    def chunk_end(self) -> int:
        """Where its next prompt chunk ends at the latest: its next stop, else `prompt_end`."""
        return next((s for s in self.stops if s > self.prefilled), self.prompt_end)

    @property
    def preparing(self) -> bool:
        return not self.ended and self.prefilled < self.prompt_end

    def hand_tail(self) -> None:
        """Once the prefill reached `prompt_end`, the prompt's last token becomes the next decode input (a no-op
        for other rows). Raises nothing."""
        if self.decode_tail and self.last_token is None and not self.generated and self.prefilled == self.prompt_end:
            self.last_token = self.prompt[-1]

    def tail_fed(self) -> bool:
        """At its first token: the decode step that sampled it fed the prompt's last token (now counted as
        prefilled). Returns whether it did here. Raises nothing."""
        if self.prefilled >= len(self.prompt):
            return False
        self.prefilled = len(self.prompt)
        return True

    @property
    def decoding(self) -> bool:
        return not self.ended and (self.last_token is not None or self.token_in_flight)

    def finish(self) -> None:
        """Mark the row ended by the engine (a cancelled row stays cancelled). Raises nothing."""
        if self.state is not RowState.CANCELLED:
            self.state = RowState.FINISHED

    def cancel(self) -> None:
        """Mark the row abandoned by its consumer (a finished row stays finished). Raises nothing."""
        if self.state is not RowState.FINISHED:
            self.state = RowState.CANCELLED

    def deliver(self, delta: Delta) -> bool:
        """Send `delta` to the consumer (gone: the row is cancelled); a final one finishes the row and closes its
        stream. Returns whether it was final. Event loop. Raises nothing."""
        final = delta.finish_reason is not None
        if final:
            self.finish()
        if not self.cancelled:
            try:
                self.send.send_nowait(delta)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.cancel()  # nobody is listening any more
        if final:
            self.send.close()
        return final

    def delta(self, text: str = "", token_ids: list[int] | None = None, finish_reason: FinishReason | None = None,
              error: str | None = None, error_param: str | None = None) -> Delta:
        """A delta of this row, with the token counts every delta carries. Raises nothing."""
        return Delta(text=text, token_ids=token_ids or [], finish_reason=finish_reason, error=error,
                     error_param=error_param, prompt_tokens=len(self.prompt), completion_tokens=len(self.generated),
                     cached_tokens=self.cached_tokens,
                     cache_write_tokens=self.cache_written)

    def outgoing(self, text: str, finish_reason: FinishReason | None, stopped_by: str | None,
                 shown_before: float) -> Delta:
        """The delta that publishes `text` with what the row holds unsent (token ids, prompt logprobs, and the
        logprobs of tokens whose whole text ends before `shown_before`, the stop matcher's shown length). Raises
        nothing."""
        ids, self.unsent_ids = self.unsent_ids, []
        delta = self.delta(text, ids, finish_reason)
        delta.stop_sequence = stopped_by if finish_reason == "stop" else None
        delta.prompt_logprobs, self.unsent_prompt_logprobs = self.unsent_prompt_logprobs, None
        if self.unsent_logprobs:
            # Tokens whose whole text has shown; those still held wait, and those a stop string cut never go (their
            # text listed past the reply's: " Paris" for a reply cut to " " by "Paris.").
            delta.logprobs = [lp for end, lp in self.unsent_logprobs if end <= shown_before]
            self.unsent_logprobs = [] if finish_reason else \
                [(end, lp) for end, lp in self.unsent_logprobs if end > shown_before]
        return delta

    def chunk_scorer(self, tokens: list[int]) -> Callable[[LogitsOf], None] | None:
        """A prompt chunk's `Segment.score` while the row scores its prompt (None otherwise): the chunk starts at
        `prefilled`, read now, before the launch counts the chunk as fed. Raises nothing."""
        scores, start = self.scores, self.prefilled
        if scores is None:
            return None
        return lambda logits_of: scores.add(start, len(tokens), logits_of)

    def end(self) -> None:
        """Finish the row without a delta (cancelled, or dropped) and close its stream. Raises nothing."""
        self.finish()
        self.send.close()

    def fed_tokens(self) -> list[int]:
        """The tokens whose KV the cache holds (the last sampled token is never fed; nor, before its first decode
        step, a `decode_tail` row's last prompt token)."""
        return self.prompt[: self.prefilled] + self.generated[:-1]


def slot_order(rows: Iterable[Row]) -> list[Row]:
    """Rows with a decode slot in slot order, the others first. Raises nothing."""
    return sorted(rows, key=lambda r: -1 if r.slot is None else r.slot)


def prefill_shares(rows: Iterable[Row], room: int) -> list[tuple[Row, int]]:
    """How many prompt tokens each preparing row gets of `room` this iteration. Oldest first, except that prompts
    shorter than what the oldest still needs go first, shortest first, within half the room (the oldest always
    gets the other half). Oldest first alone, a short prompt behind an 8,000-token one waited out its whole
    prefill (minutes on a CPU); prompts as long as the oldest still wait behind it (sharing would only delay
    both). A prompt passed over AGED times goes before the shorter ones, oldest first.
    Counts the rows passed over here (`Row.passed_over`: the decision is where ageing counts, lane or not): those
    that got nothing while a younger row got tokens; one waiting only behind older prompts is in line, not starved
    (two equal prompts: the second, aged, took half the room and only delayed the first). Raises nothing."""
    preparing = [r for r in rows if r.preparing]
    if not preparing or room <= 0:
        return []
    need = lambda r: r.prompt_end - r.prefilled  # noqa: E731
    cap = lambda r: r.chunk_end - r.prefilled  # noqa: E731  # a chunk ends at the row's next stop
    oldest, others = preparing[0], preparing[1:]
    aged = [r for r in others if r.passed_over >= AGED]
    quick = aged + sorted((r for r in others if r.passed_over < AGED and need(r) < need(oldest)),
                          key=need)  # stable: equal needs by age
    first = min(cap(oldest), max(1, room // 2) if quick else room)
    shares: list[tuple[Row, int]] = []
    left = room - first
    for r in quick:
        if left <= 0:
            break
        shares.append((r, min(left, cap(r))))
        left -= shares[-1][1]
    more = min(cap(oldest) - first, left)  # the quick prompts left room over: the oldest takes it
    left -= more
    taken = {id(r) for r, _ in shares}
    for r in others:  # then the rest, oldest first
        if left <= 0:
            break
        if id(r) not in taken:
            shares.append((r, min(left, cap(r))))
            left -= shares[-1][1]
    taken.update(id(r) for r, _ in shares)
    youngest = max((i for i, r in enumerate(preparing) if id(r) in taken), default=0)
    for r in preparing[1:youngest]:
        if id(r) not in taken:
            r.passed_over += 1
    return [(oldest, first + more), *shares]


def plan_iteration(rows: list[Row], budget: int, decode: bool,
                   prefill: bool) -> list[tuple[Row, list[int], bool]]:
    """(row, tokens, wants logits) per segment: every decoding row's token first (slot order, so a step's
    sampled tokens line up with the slots), then prompt chunks filling the rest of `budget` (`prefill_shares`).
    A row whose token is still in flight gets a placeholder the caller feeds lazily. Raises nothing."""
    plan: list[tuple[Row, list[int], bool]] = []
    if decode:
        decoders = slot_order(r for r in rows if r.decoding)
        plan += [(r, [0 if r.last_token is None else r.last_token], True) for r in decoders]
    if prefill:
        for r, n in prefill_shares(rows, budget - len(plan)):
            plan.append((r, r.prompt[r.prefilled : r.prefilled + n], r.prefilled + n == len(r.prompt)))
    return plan


class LLMRowStream:
    """Async iterator over one row's deltas. `aclose()` (or leaving `async with`) cancels the row."""

    def __init__(self, row: Row, receive: MemoryObjectReceiveStream[Delta], wake: Callable[[], None]) -> None:
        self._row = row
        self._receive = receive
        self._wake = wake  # tells the group a row changed, so an idle driver looks again

    def __aiter__(self) -> "LLMRowStream":
        return self

    async def __anext__(self) -> Delta:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._receive.close()
            raise StopAsyncIteration from None

    def receive_nowait(self) -> Delta:
        """The next delta if one is ready. Raises anyio.WouldBlock when none is, anyio.EndOfStream at the end."""
        return self._receive.receive_nowait()

    async def aclose(self) -> None:
        """Cancel the row (if still running) and release the stream. Raises nothing."""
        self.cancel()

    def cancel(self) -> None:
        """Synchronous cancel, safe from any event-loop code path (e.g. a finally). Raises nothing."""
        self._row.cancel()
        self._receive.close()
        self._wake()

    async def __aenter__(self) -> "LLMRowStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()

    def __del__(self) -> None:  # a consumer that forgets aclose still frees its row
        self._row.cancel()
        self._receive.close()
