"""audio/handoff.py: a window's lazy arrays found wherever its state keeps them, and evaluated on their thread so
another thread can step the window."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from audio.handoff import held_arrays, settle


@dataclass
class Job:
    x: Any = None
    parts: list[Any] = field(default_factory=list)
    kv: Any = None


def test_held_arrays_walks_fields_lists_tuples_and_dicts_once_each() -> None:
    a, b, c, d = (mx.arange(3) + i for i in range(4))
    job = Job(x=a, parts=[b, b], kv=(c, {"v": d}))
    window = SimpleNamespace(encoder=job, row=SimpleNamespace(batch=job), audio=np.zeros(4), model=nn.Linear(2, 2))
    window.me = window  # a cycle
    got = held_arrays([window])
    assert sorted(id(x) for x in got) == sorted(id(x) for x in (a, b, c, d))  # not the model's, each once


def test_a_window_settled_on_its_thread_steps_on_another() -> None:
    def build() -> Any:  # a step's lazy views, left in the window
        base = mx.arange(12).reshape(3, 4) * 2
        mx.eval(base)
        return SimpleNamespace(encoder=Job(x=base[1:], parts=[base[0] + 1]))

    def use(window: Any) -> Any:
        try:
            return (window.encoder.x.sum() + window.encoder.parts[0].sum()).item()
        except RuntimeError as exc:
            return exc

    with ThreadPoolExecutor(1) as builder, ThreadPoolExecutor(1) as stepper:  # two threads, each its own stream
        if not isinstance(stepper.submit(use, builder.submit(build).result()).result(), RuntimeError):
            pytest.skip("this MLX evaluates another thread's lazy arrays")  # the case the hand-off exists for
        window = builder.submit(build).result()
        assert builder.submit(settle, [window]).result() == 2
        assert stepper.submit(use, window).result() == 2 * sum(range(4, 12)) + sum(range(1, 9, 2))
