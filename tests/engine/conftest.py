"""Fixtures for the engine's tests."""

from __future__ import annotations

import mlx.core as mx
import pytest


@pytest.fixture
def stand_in_kernels(monkeypatch) -> list[tuple[str, int]]:
    """engine/fused_gemv.py's CUDA kernels served by MLX's own ops on any machine, as if on CUDA (enabled, and
    available for up to MAX_ROWS rows). Returns the (kernel, rows) calls they record (at trace time when compiled)."""
    from mlx_lm.models.activations import swiglu

    from engine import fused_gemv

    calls: list[tuple[str, int]] = []

    def norm_project(x, g, eps, w):
        calls.append(("norm_project", x.shape[0]))
        return mx.fast.rms_norm(x, g, eps) @ w.T

    def norm_swiglu(x, g, eps, w):
        calls.append(("norm_swiglu", x.shape[0]))
        return swiglu(*mx.split(mx.fast.rms_norm(x, g, eps) @ w.T, 2, axis=-1))

    def project_add(x, w, h):
        calls.append(("project_add", x.shape[0]))
        return h + x @ w.T

    monkeypatch.setattr(fused_gemv, "enabled", lambda: True)
    monkeypatch.setattr(fused_gemv, "available", lambda dtype, hidden, inter, rows: rows <= fused_gemv.MAX_ROWS)
    for fn in (norm_project, norm_swiglu, project_add):
        monkeypatch.setattr(fused_gemv, fn.__name__, fn)
    return calls
