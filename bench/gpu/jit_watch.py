"""Log each kernel module MLX's CUDA backend compiles, as it lands in the PTX cache, with the wall time.

MLX compiles a JIT module (fused elementwise graphs, gathers, scatters, custom kernels...) under one
process-wide lock, so while one thread compiles, every thread that looks up any module waits: a compile
while serving stalls every stream. A module compiled after the server said `ready` is one its warm-up missed.

    MLX_PTX_CACHE_DIR=/tmp/ptx python3 -m bench.gpu.jit_watch /tmp/ptx > modules.log &

Prints `HH:MM:SS.mmm <bytes> <module name>` per new file (polling every 0.1 s) until killed, and `READY` when
`--ready URL` first answers 200.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import urllib.request
from datetime import datetime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="MLX's PTX cache directory (MLX_PTX_CACHE_DIR)")
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--ready", default=None, help="a URL (the server's /health): print READY once it answers 200")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    seen: set[str] = set()
    try:
        seen = set(os.listdir(args.dir))
    except FileNotFoundError:
        pass
    print(f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]} watching {args.dir} ({len(seen)} modules already)", flush=True)
    ready = args.ready
    while True:
        if ready is not None:
            try:
                with urllib.request.urlopen(ready, timeout=0.5) as res:
                    if res.status == 200:
                        print(f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]} READY", flush=True)
                        ready = None
            except OSError:
                pass
        try:
            names = os.listdir(args.dir)
        except FileNotFoundError:
            names = []
        for name in sorted(set(names) - seen):
            seen.add(name)
            try:
                size = os.path.getsize(os.path.join(args.dir, name))
            except OSError:
                size = -1
            print(f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]} {size} {name}", flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
