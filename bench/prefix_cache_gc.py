"""What the prefix cache costs Python's garbage collector: objects it adds to every full collection, the
collection's time, and one lookup's time, for N cached prompts sharing a system prefix.

    python -m bench.prefix_cache_gc [--prompts 300] [--seed 0]

Startup is frozen first (as `tandem serve` does at ready), so only what the cache adds is walked. Prints JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

from engine.prefix_cache import PrefixCache  # first: engine picks the BLAS before mlx loads

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402

__all__ = ["main"]


def _kv(n: int) -> list[KVCache]:
    cache = KVCache()
    block = mx.zeros((1, 1, n, 1))
    cache.update_and_fetch(block, block)
    return [cache]


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print it. Raises SystemExit for bad arguments."""
    p = argparse.ArgumentParser(prog="python -m bench.prefix_cache_gc", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    rnd = random.Random(a.seed)
    system = [rnd.randrange(50000) for _ in range(300)]
    gc.collect()
    gc.freeze()
    before = len(gc.get_objects())
    cache = PrefixCache(1 << 40)
    tokens = 0
    for _ in range(a.prompts):
        prompt = system + [rnd.randrange(50000) for _ in range(rnd.randrange(128, 2048))]
        tokens += len(prompt)
        cache.put("m", prompt, _kv(len(prompt)))
    gc.collect()
    added = len(gc.get_objects()) - before
    t = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    for _ in range(50):
        cache.take("m", system + [1, 2, 3])
    take_ms = (time.perf_counter() - t) / 50 * 1e3
    print(json.dumps({"prompts": a.prompts, "cached_tokens": tokens, "objects_added": added,
                      "full_collection_ms": round(full_ms, 2), "take_ms": round(take_ms, 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
