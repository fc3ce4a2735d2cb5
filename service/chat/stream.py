"""A row's stream as the routes read it: (text, finish) pairs with usage counted, ids and timestamps, and
closing a row from any scope. Shared by streamed and non-streamed chat and text completions."""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import AsyncGenerator, Protocol

import anyio
import sniffio

from engine.contracts import Delta, TokenLogprob
from service.chat.replies import PromptTokensDetails, Usage
from service.http.errors import APIError
from service.seams import RowStream

__all__ = ["RowReader", "UsageCounter", "ResponseMeta", "StreamTiming", "close_stream",
           "stream_failure"]


async def close_stream(stream: RowStream) -> None:
    """aclose a row stream even from a cancelled scope (frees the row). Raises nothing."""
    with anyio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except Exception:  # closing is best effort; the engine prunes the row either way
            pass


@dataclass
class UsageCounter:
    """Token counts of one reply, from the deltas (the engine's totals win when it reports them)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    _generated: int = 0
    # False: the reply is not given (a text completion scoring its prompt, max_tokens 0), so it counts no tokens.
    reply_given: bool = True

    def add(self, delta: Delta) -> None:
        """Raises nothing."""
        self._generated += len(delta.token_ids)
        self.prompt_tokens = max(self.prompt_tokens, delta.prompt_tokens)
        self.completion_tokens = max(self.completion_tokens, delta.completion_tokens)
        self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)
        self.cache_write_tokens = max(self.cache_write_tokens, delta.cache_write_tokens)

    def totals(self) -> tuple[int, int]:
        """(prompt, completion) tokens so far. Raises nothing."""
        return self.prompt_tokens, (self.completion_tokens or self._generated) if self.reply_given else 0

    def usage(self) -> Usage:
        """Raises nothing."""
        completion = self.totals()[1]
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.prompt_tokens + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=self.cached_tokens,
                                                      cache_write_tokens=self.cache_write_tokens),
        )


@dataclass
class ResponseMeta:
    """id, created and model, shared by every chunk of one response; `continuous_usage`: each chunk carries its
    choice's usage so far (vLLM's stream_options.continuous_usage_stats, service/chat/chunk_usage.py)."""

    model: str
    prefix: str = "chatcmpl"
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    continuous_usage: bool = False

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"


class TokenLatency(Protocol):
    """Where a stream's latencies go (service/admin/metrics.py's histograms)."""

    def observe(self, amount: float) -> None: ...


@dataclass
class StreamTiming:
    """A request's arrival and deadline (time.monotonic() seconds; deadline None: none) and the
    histograms its first token and the gaps between later ones are recorded in."""

    arrival: float
    deadline: float | None = None
    ttft: TokenLatency | None = None
    itl: TokenLatency | None = None
    _last: float | None = None

    def delivered(self) -> None:
        """A delta with text or tokens arrived now. Raises nothing."""
        now = time.monotonic()
        if self._last is None:
            if self.ttft is not None:
                self.ttft.observe(now - self.arrival)
        elif self.itl is not None:
            self.itl.observe(now - self._last)
        self._last = now


class RowReader:
    """A row's deltas as (text, finish_reason) items with usage counted. Deltas already waiting when one is
    read are merged into one item, so a stream that fell behind catches up in one write. The row is closed
    however the reader is left, and when the request's deadline passes (a 504 request_timeout)."""

    def __init__(self, stream: RowStream, counter: UsageCounter, timing: StreamTiming | None = None) -> None:
        self._stream = stream
        self._deltas = stream.__aiter__()
        self._counter = counter
        self._timing = timing
        self._first: Delta | None = None
        self._timer: asyncio.TimerHandle | None = None  # the request's deadline, armed at the first wait
        self._expired = False
        self._logprobs: list[TokenLogprob] = []
        self._prompt_logprobs: list[TokenLogprob] | None = None
        # The stop string that ended the row, once its last delta is read (None: it ended otherwise).
        self.stop_sequence: str | None = None
        self.left = False  # the client left and the row was closed for it (leave)

    async def _next(self) -> Delta:
        deadline = self._timing.deadline if self._timing is not None else None
        if deadline is not None and time.monotonic() >= deadline:
            raise _timed_out()
        # A delta already waiting (the loop fell behind the engine) is taken at once: no timer, no checkpoint.
        if (delta := self._ready()) is not None:
            return delta
        if deadline is None:
            return await self._deltas.__anext__()
        if self._watch(deadline):
            try:
                return await self._deltas.__anext__()
            except StopAsyncIteration:
                if self._expired:  # the deadline's timer cancelled the row: that is why it ended
                    raise _timed_out() from None
                raise
        with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
            return await self._deltas.__anext__()
        raise _timed_out()

    def _watch(self, deadline: float) -> bool:
        """One timer for the whole request (asyncio), which cancels the row at the deadline and so ends a read
        waiting then: a timeout scope per token cost ~9 µs a delta, 13-15 % of the event loop's samples at 64
        streams on the H200. Other backends keep the scope per read (False). Raises nothing."""
        if self._timer is not None:
            return True
        try:
            if sniffio.current_async_library() != "asyncio":
                return False
            loop = asyncio.get_running_loop()
        except (sniffio.AsyncLibraryNotFoundError, RuntimeError):
            return False
        # A weak reference: a reader dropped unread (its client left before the body) is not kept to the deadline.
        self._timer = loop.call_later(max(0.0, deadline - time.monotonic()), _expire, weakref.ref(self))
        return True

    def _expire(self) -> None:
        self._expired = True
        self._stream.cancel()

    async def leave(self) -> None:
        """The client is gone: close the row, whose end is then no failure (a reader in a task still reading it, a
        tool reply's, had logged "the engine stopped"). Raises nothing."""
        self.left = True
        await self._close()

    async def _close(self) -> None:
        """The reader is done: disarm the deadline's timer and close the row. Raises nothing."""
        if self._timer is not None:
            self._timer.cancel()
        await close_stream(self._stream)

    async def start(self, wait: float | None = None) -> bool:
        """Wait for the row's first delta (call before any response header goes out), at most `wait` seconds
        when given: True once it is held, False while it is still to come (the row stays open; call again).
        Raises APIError 500, the row closed, when the row failed or ended before producing anything, 504 past
        the deadline."""
        if self._first is not None:
            return True
        try:
            delta: Delta | None = None
            # A row stream's read gives nothing up when cancelled (a memory stream's receive: service/seams.py).
            with anyio.CancelScope() if wait is None else anyio.move_on_after(wait):
                delta = await self._next()
            if delta is None:
                return False
            self._check(delta)
        except StopAsyncIteration:
            await self._close()
            raise APIError(500, _UNFINISHED, type="server_error") from None
        except BaseException:
            await self._close()
            raise
        self._first = delta
        return True

    async def items(self) -> AsyncGenerator[tuple[str, str | None], None]:
        """(text, finish_reason) until the item that carries the finish reason. Raises APIError 500 when the
        row fails or never finishes."""
        try:
            while True:
                if self._first is not None:
                    delta, self._first = self._first, None
                else:
                    try:
                        delta = await self._next()
                    except StopAsyncIteration:
                        break
                    self._check(delta)
                text, finish = delta.text, delta.finish_reason
                while finish is None and (more := self._ready()) is not None:
                    self._check(more)
                    text, finish = text + more.text, more.finish_reason
                yield text, finish
                if finish is not None:
                    return
        finally:
            await self._close()
        if not self.left:
            raise APIError(500, _UNFINISHED, type="server_error")

    @property
    def counter(self) -> UsageCounter:
        """The row's usage, counted as its deltas are read. Raises nothing."""
        return self._counter

    def take_logprobs(self) -> list[TokenLogprob]:
        """The log probabilities of the tokens read since the last call (rows that asked for them). Raises
        nothing."""
        taken, self._logprobs = self._logprobs, []
        return taken

    def take_prompt_logprobs(self) -> list[TokenLogprob] | None:
        """The prompt's log probabilities (after its first token), once they came (rows that asked: with the first
        delta, which `start` reads); None otherwise. Raises nothing."""
        taken, self._prompt_logprobs = self._prompt_logprobs, None
        return taken

    def _check(self, delta: Delta) -> None:
        self._counter.add(delta)
        if delta.stop_sequence is not None:
            self.stop_sequence = delta.stop_sequence
        if delta.logprobs:
            self._logprobs.extend(delta.logprobs)
        if delta.prompt_logprobs is not None:
            self._prompt_logprobs = delta.prompt_logprobs
        if self._timing is not None and (delta.token_ids or delta.text):
            self._timing.delivered()
        if failure := stream_failure(delta.error, delta.finish_reason):
            if failure == _CANCELLED:  # the engine closed under it: retry once the server is back
                raise APIError(503, failure, type="server_error", code="shutting_down", retry_after=5)
            if delta.error_param is not None:  # what the request asked for failed (its grammar): the same again would
                raise APIError(400, failure, param=delta.error_param, code="schema_failed", should_retry=False)
            raise APIError(500, failure, type="server_error")

    def _ready(self) -> Delta | None:
        try:
            return self._stream.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return None


def _expire(reader: "weakref.ref[RowReader]") -> None:
    if (alive := reader()) is not None:
        alive._expire()


def _timed_out() -> APIError:
    # x-should-retry false: the same request runs past the same deadline again (the SDKs retry a 504 twice).
    return APIError(504, "The request took longer than the server's request timeout; the generation was stopped.",
                    type="server_error", code="request_timeout", should_retry=False)


_UNFINISHED = "The generation ended without finishing (the engine stopped)."
_CANCELLED = "The generation was cancelled (the server is shutting down)."


def stream_failure(delta_error: str | None, finish_reason: str | None) -> str | None:
    """Why a row ended without a usable finish, or None when it finished normally. Raises nothing."""
    if delta_error:
        return delta_error
    if finish_reason == "cancelled":
        return _CANCELLED
    if finish_reason == "error":
        return "The generation failed."
    return None
