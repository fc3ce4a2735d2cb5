"""Agent-turn benchmark: time to first token per turn of a 10-turn conversation with a ~2k-token
system prompt, with the prefix cache and without, same model, same run.

    uv run python -m bench.agent_turns [--model SPEC] [--turns 10] [--system-tokens 2000] [--max-tokens 16]

Each turn appends the previous reply and a new user message, the way a coding agent does. TTFT is a
`max_tokens=1` request (prefill + the first sample: the engine may hold the first text back), sent
to the warm engine (prefix cache on, session id set) and to the cold one (cache off) with exactly the
same prompt; the warm engine then generates the reply that the next turn appends. Prints one JSON
document; per-turn rows go to stderr as they come.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import anyio

from service.chat.prompt import render_prompt, system_prefix_end

__all__ = ["main", "system_prompt"]

_TOOL = (
    "Tool {i}: `{name}` — {what}. Arguments: path (string, required), offset (integer, optional), "
    "limit (integer, optional). Returns the result as text; errors are reported, never raised. "
)
_NAMES = ["read", "bash", "edit", "write", "grep", "find", "ls", "test", "diff", "patch"]
_WHAT = [
    "read the contents of a file", "run a shell command", "replace exact text in a file",
    "create or overwrite a file", "search files for a pattern", "find files by name",
    "list a directory", "run the test suite", "show changes", "apply a unified diff",
]


def system_prompt(tokenizer: Any, tokens: int) -> str:
    """An agent-style system prompt (guidelines + tool descriptions) of about `tokens` tokens. Raises nothing."""
    parts = ["You are an expert coding assistant operating inside a coding agent harness. "
             "You help users by reading files, executing commands, editing code, and writing new files.\n"]
    i = 0
    while len(tokenizer.encode("".join(parts))) < tokens:
        parts.append(_TOOL.format(i=i, name=_NAMES[i % 10], what=_WHAT[i % 10]))
        i += 1
    return "".join(parts)


async def _turn(engine: Any, prompt: list[int], boundaries: tuple[int, ...], session: str | None,
                max_tokens: int, namespace: str = "bench") -> dict[str, Any]:
    from engine.contracts import GenerationRequest, SamplingParams

    request = GenerationRequest(prompt_tokens=prompt, sampling=SamplingParams(temperature=0.0), max_tokens=max_tokens,
                                session_id=session, namespace=namespace, segment_boundaries=boundaries)
    start = time.perf_counter()
    ttft = None
    text, tokens, cached = "", [], 0
    async with engine.submit(request) as stream:
        async for delta in stream:
            if ttft is None:
                ttft = time.perf_counter() - start
            text += delta.text
            tokens += delta.token_ids
            cached = delta.cached_tokens
            if delta.finish_reason is not None:
                break
    return {"ttft_s": round(ttft or 0.0, 4), "total_s": round(time.perf_counter() - start, 4),
            "cached_tokens": cached, "text": text, "tokens": tokens}


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.context import EngineThread
    from engine.models import load_model
    from engine.prefix_cache import PrefixCache
    from engine.runtime import Engine

    loader = EngineThread("load")
    loaded = await loader.run(load_model, args.model)
    loader.close()
    tokenizer = loaded.tokenizer
    warm = Engine(loaded, prefix_cache=PrefixCache(args.cache_bytes))
    cold = Engine(loaded, prefix_cache=None)
    messages = [{"role": "system", "content": system_prompt(tokenizer, args.system_tokens)}]
    rows = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(warm.serve)
        tg.start_soon(cold.serve)
        # First-use costs (allocations, BLAS threads) land on neither side's turn 1.
        for engine in (warm, cold):
            await _turn(engine, render_prompt(tokenizer, [{"role": "user", "content": "warm up " * 64}]), (), None, 2, "warmup")
        for turn in range(1, args.turns + 1):
            messages.append({"role": "user", "content": f"Step {turn}: look at file_{turn}.py and tell me what to change."})
            prompt = render_prompt(tokenizer, messages)
            bounds = system_prefix_end(tokenizer, messages, prompt)
            w = await _turn(warm, prompt, bounds, "bench-session", 1)
            c = await _turn(cold, prompt, bounds, None, 1)
            reply = await _turn(warm, prompt, bounds, "bench-session", args.max_tokens)
            rows.append({"turn": turn, "prompt_tokens": len(prompt), "cached_tokens": w["cached_tokens"],
                         "ttft_cached_s": w["total_s"], "ttft_cold_s": c["total_s"],
                         "ratio": round(w["total_s"] / c["total_s"], 3) if c["total_s"] else None,
                         "same_first_token": w["tokens"] == c["tokens"], "reply_s": reply["total_s"]})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            messages.append({"role": "assistant", "content": reply["text"]})
        stats = warm.stats().get("prefix_cache")
        warm.close()
        cold.close()
    later = [r["ratio"] for r in rows[1:] if r["ratio"] is not None]
    return {
        "model": loaded.name,
        "system_prompt_tokens": len(tokenizer.encode(messages[0]["content"])),
        "turns": rows,
        "median_ratio_turns_2_plus": round(statistics.median(later), 3) if later else None,
        "max_ratio_turns_2_plus": max(later) if later else None,
        "all_same_first_token": all(r["same_first_token"] for r in rows),
        "prefix_cache": stats,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON. Raises ModelNotFound when the model cannot be found."""
    parser = argparse.ArgumentParser(prog="tandem benchmark agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model spec (default: the demo model)")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--system-tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--cache-bytes", type=int, default=2 << 30)
    args = parser.parse_args(argv)
    import engine  # noqa: F401  (picks the BLAS before mlx loads)

    print(json.dumps(anyio.run(_run, args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
