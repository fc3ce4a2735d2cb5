"""mlx_lm.server's penalty windows (`repetition_context_size`, `presence_context_size`, `frequency_context_size`):
a penalty given one counts only the last N tokens of prompt + reply, through mlx-lm's own logits processors, so a
row penalised so gets exactly the logits mlx-lm's would. N = 0 counts them all, as mlx-lm's `tokens[-0:]` does.
Penalties without a window are engine/sampling.py's (OpenAI's: the whole reply, repetition_penalty the prompt too).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import make_frequency_penalty, make_presence_penalty, make_repetition_penalty

from engine.contracts import SamplingParams

__all__ = ["PenaltyWindows", "MAX_WINDOW"]

# Past any context: a larger window counts everything, as 0 does (and fits a deque's and a slice's integers).
MAX_WINDOW = 1 << 31


class PenaltyWindows:
    """One row's windowed penalties: the last tokens they look at, and mlx-lm's processors over them."""

    def __init__(self, processors: list[Callable[[mx.array, mx.array], mx.array]], longest: int | None,
                 prompt_tokens: Sequence[int]) -> None:
        self._processors = processors
        self._recent: deque[int] = deque(prompt_tokens, maxlen=longest)

    @classmethod
    def of(cls, params: SamplingParams, prompt_tokens: Sequence[int]) -> PenaltyWindows | None:
        """The windows `params` ask for (None when no penalty in effect has one: such rows pay nothing).
        Raises nothing for validated params (engine/sampling.py validate_sampling)."""
        wanted = [(make, penalty, size) for make, penalty, size, off in (
            (make_repetition_penalty, params.repetition_penalty, params.repetition_context_size, 1.0),
            (make_presence_penalty, params.presence_penalty, params.presence_context_size, 0.0),
            (make_frequency_penalty, params.frequency_penalty, params.frequency_context_size, 0.0))
            if size is not None and penalty != off]
        if not wanted:
            return None
        sizes = [0 if size >= MAX_WINDOW else size for _, _, size in wanted]
        processors = [make(penalty, size) for (make, penalty, _), size in zip(wanted, sizes)]
        return cls(processors, None if 0 in sizes else max(sizes), prompt_tokens)

    def apply(self, logits: mx.array) -> mx.array:
        """`logits` (1, vocab) penalised as mlx-lm's processors would, in its order (repetition, presence,
        frequency). Lazy. Raises nothing."""
        if not self._recent:
            return logits
        tokens = mx.array(list(self._recent))
        for processor in self._processors:
            logits = processor(tokens, logits)
        return logits

    def accept(self, token: int) -> None:
        """A sampled token joins the window. Raises nothing."""
        self._recent.append(token)
