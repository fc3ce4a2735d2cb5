"""What each chunk of a streamed chat or text completion says of usage, by its `stream_options`: nothing without
`include_usage`; `"usage": null` with it, the usage chunk (`choices: []`) coming last, as OpenAI's; with vLLM's
`continuous_usage_stats` too, the usage so far of the chunk's own choice — its prompt's tokens and its reply's, as
vLLM counts them per choice — so a benchmark (guidellm) reads the counts as they grow; the role chunk, which shows
nothing generated, says 0 completion tokens, as vLLM's first chunk does. The usage chunk still sums the request (each
prompt once).
"""

from __future__ import annotations

from service.chat.stream import UsageCounter

__all__ = ["ChunkUsage"]

_USAGE = b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,' \
         b'"prompt_tokens_details":{"cached_tokens":%d,"cache_write_tokens":%d}}}\n\n'


class ChunkUsage:
    """How one choice's chunks end: `include` (stream_options.include_usage) gives them `"usage": null`, a
    `counter` (the choice's, given only with continuous_usage_stats) its counts at the chunk instead."""

    def __init__(self, include: bool, counter: UsageCounter | None = None) -> None:
        self._counter = counter if include else None
        self._static = b',"usage":null}\n\n' if include else b"}\n\n"

    def end(self, shows_reply: bool = True) -> bytes:
        """The bytes that close a chunk's JSON object and its event, the usage field first when it has one
        (`shows_reply` False: a chunk showing none of the reply, whose completion tokens are 0). Raises nothing."""
        if (counter := self._counter) is None:
            return self._static
        prompt, completion = counter.totals()
        completion = completion if shows_reply else 0
        return _USAGE % (prompt, completion, prompt + completion, counter.cached_tokens, counter.cache_write_tokens)

    def mark(self, event: bytes, shows_reply: bool = True) -> bytes:
        """`event` (`data: {...}\\n\\n`, its JSON without a usage field) ending as end() says. Raises nothing."""
        return event[:-3] + self.end(shows_reply)
