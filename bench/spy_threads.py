"""Where each thread's samples land in a py-spy raw profile (`record --threads --native --idle -f raw`, e.g. from
bench/gpu/profile_serve.sh): per thread, the share of samples under each innermost Python frame with the native
leaf below it, and the share waiting on a condition variable straight out of a Python frame (CPython's GIL
hand-off: the thread asked to let go waits in `drop_gil`, the one that wants it back in `take_gil`).

    python -m bench.spy_threads PROFILE.raw [--top 25] [--thread tandem-engine]
"""

from __future__ import annotations

import argparse
import collections
import re

__all__ = ["main", "summarise"]

_GIL_WAIT = ("pthread_cond_wait", "pthread_cond_timedwait")


def summarise(lines: list[str]) -> dict[str, collections.Counter[str]]:
    """thread name -> Counter of "innermost Python frame > native leaf" (prefixed "GIL-WAIT " for a hand-off
    wait). Raises ValueError for a line that is not `stack count`."""
    by: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        name = frames[0].split(":", 1)[1].strip() if ":" in frames[0] else frames[0]
        py = [i for i, f in enumerate(frames) if ".py:" in f]
        last = py[-1] if py else 0
        below = frames[last + 1:]
        gil = bool(below) and below[0].startswith(_GIL_WAIT)  # no native frame between: the interpreter's own wait
        where = re.sub(r"\(.*/", "(", frames[last]) if py else "(no Python frame)"
        leaf = re.sub(r"^0x[0-9a-f]+ ", "", below[-1])[:60] if below else ""
        by[name][("GIL-WAIT " if gil else "") + where + (f" > {leaf}" if leaf else "")] += int(count)
    return by


def main(argv: list[str] | None = None) -> int:
    """Print the summary. Raises SystemExit on bad options, OSError for an unreadable file."""
    p = argparse.ArgumentParser(prog="python -m bench.spy_threads", description=__doc__.splitlines()[0])
    p.add_argument("profile")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--thread", default=None, help="only threads whose name contains this")
    a = p.parse_args(argv)
    with open(a.profile) as f:
        by = summarise(f.readlines())
    for name, counts in sorted(by.items(), key=lambda kv: -sum(kv[1].values())):
        if a.thread and a.thread not in name:
            continue
        total = sum(counts.values())
        waits = sum(c for k, c in counts.items() if k.startswith("GIL-WAIT"))
        print(f"== {name}: {total} samples, {100 * waits / total:.1f} % waiting for the GIL")
        for key, c in counts.most_common(a.top):
            print(f"   {100 * c / total:5.1f} %  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
