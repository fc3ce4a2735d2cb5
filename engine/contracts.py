"""Value types shared by the driver, the groups and their callers, and the Protocol the driver runs engine
work through (ExecutionContext; the ExecutionGroup it advances lives in engine/driver.py). What service/
needs of the engine is service/seams.py.

Everything here is plain Python: the service layer builds these objects and reads deltas back,
never touching an mx array.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Sequence

__all__ = [
    "SamplingParams",
    "GrammarSpec",
    "TokenLogprob",
    "GenerationRequest",
    "Delta",
    "FinishReason",
    "ExecutionContext",
]

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class GrammarSpec:
    """What a reply must follow (engine/constraints.py), in phases: nothing until it has written the `after` tokens
    (a thinking block's end; a call's opening marker when only calls are constrained), then `text` (the answer's
    grammar; None: free), whose first token may instead be `escape` (the call marker) or `think`'s start (then free
    until its end, and the answer after it), then `calls` (the calls' grammar; None: free)."""

    text: str | None
    after: tuple[int, ...] = ()
    escape: int | None = None
    calls: str | None = None
    # A thinking block's (start, end) tokens: the answer may open with one instead (a model that decides to think).
    think: tuple[int, int] | None = None


@dataclass(frozen=True)
class SamplingParams:
    """Per-row sampling settings (OpenAI names). temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # mlx_lm.server's penalty windows: a penalty given one counts the last N tokens of prompt + reply (0: all), as
    # mlx-lm's processors do (engine/penalty_window.py); None: OpenAI's (the reply; repetition_penalty the prompt too).
    repetition_context_size: int | None = None
    presence_context_size: int | None = None
    frequency_context_size: int | None = None
    # XTC (engine/xtc.py, mlx-lm's): with this probability a draw drops the tokens likelier than the threshold but one.
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    logit_bias: dict[int, float] | None = None
    # None: no log probabilities; k: each sampled token's, with the k likeliest (0..20) beside it.
    logprobs: int | None = None
    # A grammar the reply must follow (engine/constraints.py).
    grammar: GrammarSpec | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log probability under the model (its raw logits, before any sampling setting), and the
    likeliest tokens' as (token id, log probability), likeliest first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class GenerationRequest:
    """One LLM generation: a tokenized prompt plus how to sample and when to stop."""

    prompt_tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    # vLLM's: the end-of-sequence and stop token ids cannot be sampled, and no stop string ends the row, before this
    # many tokens (as many as max_tokens at most: a max_tokens the engine lowered lowers it too).
    min_tokens: int = 0
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    # vLLM's: the model's end-of-sequence tokens do not end the row (stop_token_ids, stop strings and max_tokens do).
    ignore_eos: bool = False
    # Prefix-cache hints: never change results, only which cached KV is continued.
    session_id: str | None = None
    namespace: str = ""
    # Token offsets where reusable segments end (e.g. after the system prompt): snapshot there.
    segment_boundaries: Sequence[int] = ()
    # False when the client set no limit: the engine may lower max_tokens to fit its memory budget.
    max_tokens_requested: bool = True
    # A text completion continues its prompt: the first token's leading space is part of its text.
    continuation: bool = False
    # False: special tokens written mid-reply show in its text (engine/special_tokens.py hides them by default).
    skip_special_tokens: bool = True
    # None: none; k: each prompt token's log probability after those before it, with the k likeliest there (0..20;
    # vLLM's prompt_logprobs). The whole prompt is then prefilled: a prefix-cache hit would skip positions.
    prompt_logprobs: int | None = None
    # Which of its request's choices this row is (n > 1, or a completion's several prompts): a row waits behind the
    # waiting rows of other requests' earlier choices, so one request's many choices never hold back the others.
    choice: int = 0
    # The client request whose choice this row is, one key for all its rows (None: a request of its own): the queue
    # limit counts requests, so one request's n choices hold one place (engine/waiting_rows.py).
    origin: str | None = None


@dataclass
class Delta:
    """What one row produced in one iteration; the last one carries finish_reason."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Prompt tokens whose KV the row newly stored in the prefix cache (known once it has left: the final delta; 0
    # without a prefix cache or where the cache held them already, whether or not the row read them from there).
    cache_write_tokens: int = 0
    error: str | None = None
    # The request field whose demand failed the row (a grammar it asked for), None for the server's own failure.
    error_param: str | None = None
    # Rows that asked for log probabilities: one per token whose text begins to show here (never a stop token's,
    # nor one a stop string cut off).
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # Rows that asked for the prompt's: on the first delta, one per prompt token after the first (which has none).
    prompt_logprobs: list[TokenLogprob] | None = None
    # The stop string that ended the row (a final delta whose finish_reason is "stop"); None for any other end.
    stop_sequence: str | None = None


class ExecutionContext(Protocol):
    """Runs MLX work on the single engine thread; the event loop only awaits it."""

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the engine thread. Once started it completes even if the caller is cancelled."""
        ...

    def close(self) -> None:
        """Stop accepting work; the driver loop exits."""
