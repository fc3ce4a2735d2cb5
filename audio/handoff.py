"""Handing Whisper windows from one step thread to another: every MLX array a window holds, evaluated on the
thread that built it first.

A step leaves cheap lazy views in a window's state (each window's slice of a stacked unit, the chunks of a stage
before they are joined), and MLX runs an op on the stream of the thread that built it: another thread evaluating
them fails ("There is no Stream(cpu, N) in current thread"). The scheduler moves steps between a niced thread and
one at the process's priority as chat comes and goes (audio/scheduler.py), and settles the windows first.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.context import EngineThread

__all__ = ["held_arrays", "settle", "hand_over"]

_LEAVES = (str, bytes, int, float, bool, type(None), np.ndarray, nn.Module)  # hold no lazy array of a window's


def held_arrays(roots: Iterable[Any]) -> list[mx.array]:
    """The MLX arrays reachable from `roots` through dataclass fields, object attributes, lists, tuples, sets and
    dict values (models and numpy arrays are not walked: a model's arrays are evaluated when it loads), each once.
    Raises nothing."""
    found: dict[int, mx.array] = {}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if isinstance(obj, mx.array):
            found.setdefault(id(obj), obj)
            continue
        if isinstance(obj, _LEAVES) or id(obj) in seen or type(obj).__module__.startswith(("anyio", "mlx_whisper")):
            continue  # scopes and events; mlx-whisper's tokenizer and decoding options
        seen.add(id(obj))
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return list(found.values())


def settle(windows: Iterable[Any]) -> int:
    """Evaluate every array `windows` hold (on the thread that built them, before another thread steps them);
    returns how many there were. Raises what evaluating them raises."""
    arrays = held_arrays(windows)
    if arrays:
        mx.eval(arrays)
    return len(arrays)


async def hand_over(previous: EngineThread | None, thread: EngineThread, windows: list[Any]) -> bool:
    """Before `thread` steps `windows`: settle them on `previous`, the thread of their last step, when it is another
    one; returns whether it did. Raises what settling raises."""
    if previous is None or previous is thread or not windows:
        return False
    await previous.run(settle, windows)
    return True
