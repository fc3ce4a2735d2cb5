"""Statistics of a serving run: percentiles, per-token inter-token latency, one scenario's summary.

Per-token ITL: a server may put several tokens in one SSE chunk (coalescing what an iteration made). The
client sees only chunk arrival times, so a chunk's gap to the previous content chunk is spread evenly over
the tokens it carries: a chunk of k tokens arriving g after the previous one gives k samples of g/k. Tokens
per chunk come from re-tokenizing each chunk's text, then are scaled (largest remainder, at least one per
chunk) so they add up to the server's `usage.completion_tokens` when it reports one. Tokens that arrive in
the first content chunk beyond the first token get no ITL sample: their gap is the prefill (TTFT), not decode.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["RequestResult", "percentile", "allocate_tokens", "token_itls", "summarize"]


@dataclass
class RequestResult:
    """One request as the client saw it (times from time.perf_counter)."""

    t_start: float
    t_end: float = 0.0
    error: str | None = None  # None: answered in full (or disconnected on purpose)
    status: int | None = None
    chunk_times: list[float] = field(default_factory=list)  # one per content chunk
    chunk_texts: list[str] = field(default_factory=list)
    completion_tokens: int | None = None  # usage, when the server sent it
    prompt_tokens: int | None = None
    disconnected: bool = False  # the client hung up on purpose (soak)
    not_sent: bool = False  # the scenario's deadline came before its start time
    retries: int = 0  # sends again after a transport error before any response header
    chunk_tokens: list[int] = field(default_factory=list)  # filled by count_tokens()

    @property
    def ok(self) -> bool:
        return self.error is None and not self.not_sent

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.t_start if self.chunk_times else None

    @property
    def output_tokens(self) -> int:
        """Tokens delivered: usage when reported (and the request ended normally), else the re-tokenized count."""
        if self.completion_tokens is not None and not self.disconnected:
            return self.completion_tokens
        return sum(self.chunk_tokens) if self.chunk_tokens else len(self.chunk_times)

    def count_tokens(self, tokens_of: Callable[[str], int] | None) -> None:
        """Fill chunk_tokens (re-tokenized estimates scaled to usage). Raises nothing."""
        estimates = [max(1, tokens_of(t)) if tokens_of else 1 for t in self.chunk_texts]
        total = None if self.disconnected else self.completion_tokens
        self.chunk_tokens = allocate_tokens(estimates, total)


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default method); NaN for no data. Raises nothing."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def allocate_tokens(estimates: Sequence[int], total: int | None) -> list[int]:
    """Integer tokens per chunk proportional to `estimates`, summing to `total` (largest remainder).

    Every chunk keeps at least one token; when `total` is None, or smaller than the number of chunks (a server
    that counts differently), the estimates are returned unchanged. Raises nothing.
    """
    est = [max(1, int(e)) for e in estimates]
    n = len(est)
    if total is None or n == 0 or total < n or total == sum(est):
        return est
    # Give every chunk its one token, share the rest by the estimates beyond one (or evenly).
    spare = total - n
    weights = [e - 1 for e in est]
    if sum(weights) == 0:
        weights = [1] * n
    wsum = sum(weights)
    raw = [spare * w / wsum for w in weights]
    out = [1 + math.floor(r) for r in raw]
    left = total - sum(out)
    for i in sorted(range(n), key=lambda i: raw[i] - math.floor(raw[i]), reverse=True)[:left]:
        out[i] += 1
    return out


def token_itls(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """Per-token gaps (seconds): chunk i ≥ 1 gives chunk_tokens[i] samples of its gap / chunk_tokens[i].

    Raises ValueError when the two sequences differ in length.
    """
    if len(chunk_times) != len(chunk_tokens):
        raise ValueError(f"{len(chunk_times)} chunk times but {len(chunk_tokens)} token counts")
    out: list[float] = []
    for i in range(1, len(chunk_times)):
        k = max(1, chunk_tokens[i])
        gap = (chunk_times[i] - chunk_times[i - 1]) / k
        out.extend([gap] * k)
    return out


def _spread(xs: Sequence[float], ps: tuple[int, ...]) -> dict[str, float | None]:
    """Percentiles `ps` and the max of `xs` (seconds) in ms. Raises nothing."""
    return {f"p{p}": _ms(percentile(xs, p)) for p in ps} | {"max": _ms(max(xs, default=math.nan))}


def _ms(x: float) -> float | None:
    return None if math.isnan(x) else round(x * 1000.0, 2)


def summarize(results: Sequence[RequestResult], wall: float) -> dict[str, Any]:
    """One scenario's figures (times in ms, rates per second). Call count_tokens() on each result first.

    Throughput counts every token delivered to a client (also of requests that later failed) over the
    scenario's wall time. Latencies are over requests that ended without error. Raises nothing.
    """
    sent = [r for r in results if not r.not_sent]
    ok = [r for r in sent if r.error is None]
    answered = [r for r in ok if not r.disconnected]
    failed = [r for r in sent if r.error is not None]
    reasons = Counter((r.error or "").split(":")[0] for r in failed)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    per_request = [token_itls(r.chunk_times, r.chunk_tokens) for r in ok]
    itls = [x for gaps in per_request for x in gaps]
    # The gap after a stream's first token (its row moves from prefill into the decode batch) against the others.
    firsts = [gaps[0] for gaps in per_request if gaps]
    later = [x for gaps in per_request for x in gaps[1:]]
    e2e = [r.t_end - r.t_start for r in answered]
    delivered = sum(r.output_tokens for r in sent)
    chunks = sum(len(r.chunk_times) for r in ok)
    decode_rates = [
        (sum(r.chunk_tokens) - r.chunk_tokens[0]) / (r.chunk_times[-1] - r.chunk_times[0])
        for r in answered
        if len(r.chunk_times) >= 2 and r.chunk_times[-1] > r.chunk_times[0]
    ]
    prompts = [r.prompt_tokens for r in answered if r.prompt_tokens is not None]
    return {
        "requests": len(results),
        "ok": len(answered),
        "failed": len(failed) + (len(results) - len(sent)),
        "failed_reasons": dict(reasons) | ({"not_sent": len(results) - len(sent)} if len(sent) < len(results) else {}),
        "first_errors": [r.error for r in failed[:3]],
        "disconnected": sum(r.disconnected for r in ok),
        "retried": sum(r.retries > 0 for r in sent),
        "wall_s": round(wall, 3),
        "output_tokens": delivered,
        "tok_s": round(delivered / wall, 2) if wall > 0 else None,
        "mean_output_tokens": round(sum(r.output_tokens for r in answered) / len(answered), 1) if answered else None,
        "mean_prompt_tokens": round(sum(prompts) / len(prompts), 1) if prompts else None,
        "usage_reported": sum(r.completion_tokens is not None for r in answered),
        "tokens_per_chunk": round(sum(sum(r.chunk_tokens) for r in ok) / chunks, 3) if chunks else None,
        "ttft_ms": _spread(ttfts, (50, 90, 99)),
        "itl_ms": _spread(itls, (50, 90, 99)),
        "itl_first_ms": _spread(firsts, (50, 99)),
        "itl_later_ms": _spread(later, (50, 99)),
        "e2e_ms": {f"p{p}": _ms(percentile(e2e, p)) for p in (50, 99)},
        "decode_tok_s_per_stream": round(sum(decode_rates) / len(decode_rates), 2) if decode_rates else None,
    }
