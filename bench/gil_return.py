"""How late a thread gets the GIL back from a call that frees it (as `mx.async_eval` and a device read do) while
another thread runs pure Python: with the serving switch interval (5 ms) and inside engine/gil.py's QuickReturn.
Figures for deciding the decode thread's GIL hand-off, not a comparison.

    python -m bench.gil_return [--calls 100] [--call-ms 1.0] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from engine.gil import GIL_RETURN_SECONDS, GIL_SWITCH_SECONDS, QuickReturn

__all__ = ["late_ms", "main"]


def late_ms(quick: QuickReturn, calls: int, call_s: float) -> list[float]:
    """Milliseconds past `call_s` each of `calls` GIL-freeing calls (time.sleep) took to return. Raises nothing."""
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        with quick.around():
            time.sleep(call_s)
        out.append(1e3 * (time.perf_counter() - t0 - call_s))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line per (round, mode). Raises SystemExit on bad options."""
    p = argparse.ArgumentParser(prog="python -m bench.gil_return", description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--call-ms", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    stop = threading.Event()

    def python_loop() -> None:  # holds the GIL but for forced switches
        n = 0
        while not stop.is_set():
            n += 1

    before = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    busy = threading.Thread(target=python_loop, daemon=True)
    busy.start()
    try:
        for r in range(a.rounds):
            for mode, quick in (("switch interval", QuickReturn(None)), ("quick return", QuickReturn(GIL_RETURN_SECONDS))):
                late = late_ms(quick, a.calls, a.call_ms / 1e3)
                print(json.dumps({"round": r + 1, "mode": mode, "late_ms_p50": round(statistics.median(late), 3),
                                  "late_ms_p90": round(late[int(0.9 * (len(late) - 1))], 3),
                                  "late_ms_max": round(late[-1], 3)}))
    finally:
        stop.set()
        busy.join()
        sys.setswitchinterval(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
