"""A row's prompt log probabilities (vLLM's `prompt_logprobs`, what evaluation harnesses score text by): each prompt
token's log probability after the tokens before it, with the k likeliest there, computed from the logits of every
position its prefill chunks feed. The lm head runs over `SPAN` positions at a time, so a chunk's logits are never all
held at once (2,048 positions × a 49k vocabulary of float32 are 400 MB)."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import mlx.core as mx

from engine.contracts import TokenLogprob
from engine.sampling import LogprobBlock

__all__ = ["PromptScores", "LogitsOf", "SPAN", "fresh_scores"]

SPAN = 128  # positions per lm-head block: (128, vocab) float32 logits, 25 MB at a 49k vocabulary
# The logits (positions, vocab) of a chunk's positions [a, b), lazily.
LogitsOf = Callable[[int, int], mx.array]


class PromptScores:
    """One row's prompt log probabilities, block by block as its chunks are fed; read once, at its first token."""

    def __init__(self, prompt: Sequence[int], k: int) -> None:
        """`k`: how many likeliest tokens to give beside each prompt token (0..20). Raises nothing."""
        self.prompt = list(prompt)
        self.k = k
        self._blocks: list[tuple[LogprobBlock, list[int]]] = []
        self._fresh = 0  # blocks before this one were handed out for evaluation

    def add(self, start: int, n: int, logits_of: LogitsOf) -> None:
        """The chunk of `n` prompt tokens from position `start` was fed; `logits_of` gives its positions' logits.
        Lazy. Raises nothing."""
        # Position p's logits predict token p + 1: the prompt's last position predicts the reply, not the prompt.
        last = min(n, len(self.prompt) - 1 - start)
        for a in range(0, last, SPAN):
            b = min(a + SPAN, last)
            targets = self.prompt[start + a + 1 : start + b + 1]
            self._blocks.append((LogprobBlock(logits_of(a, b), mx.array(targets), self.k), targets))

    def fresh(self) -> list[mx.array]:
        """The arrays of the blocks added since the last call: to evaluate with the forward they came from. Raises
        nothing."""
        arrays = [a for block, _ in self._blocks[self._fresh:] for a in block.arrays]
        self._fresh = len(self._blocks)
        return arrays

    def take(self) -> list[TokenLogprob]:
        """Every prompt token's entry after the first, in order; the blocks are dropped. Blocks until they are
        evaluated. Raises nothing of its own."""
        out = [block.row(i, token, self.k) for block, targets in self._blocks for i, token in enumerate(targets)]
        self._blocks, self._fresh = [], 0
        return out


def fresh_scores(scores: Iterable[PromptScores | None]) -> list[mx.array]:
    """The arrays the chunks just added to these rows' scores, to evaluate with the forward. Raises nothing."""
    return [a for s in scores if s is not None for a in s.fresh()]
