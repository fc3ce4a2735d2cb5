"""resolve_execution — how the batch group will run a model, and why, in words /stats can show."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn

from engine.runner import packed_support

__all__ = ["ExecutionPlan", "resolve_execution", "PACKED_MIXED", "SEPARATE_PASSES"]

PACKED_MIXED = "packed-mixed"
SEPARATE_PASSES = "separate-passes"


@dataclass(frozen=True)
class ExecutionPlan:
    """`method`: packed-mixed | separate-passes; `mechanism`: device and BLAS; `features`: what the
    group does (continuous batching, chunked prefill, mixed iterations, ...); `reasons`: one line each."""

    method: str
    mechanism: str
    features: tuple[str, ...] = ()
    reasons: list[str] = field(default_factory=list)

    @property
    def packed(self) -> bool:
        return self.method == PACKED_MIXED

    def as_dict(self) -> dict[str, Any]:
        """Plain-data form for /stats. Raises nothing."""
        return {"method": self.method, "mechanism": self.mechanism, "features": list(self.features),
                "reasons": list(self.reasons)}


def _mechanism(backend: Any) -> tuple[str, str | None]:
    import mlx.core as mx

    device = mx.default_device()
    kind = "gpu" if device.type == mx.DeviceType.gpu else "cpu"
    name = f"mlx-{kind}"
    if backend is None:
        return name, None
    if isinstance(backend, str):
        return f"{name} ({backend})", f"backend: {backend}"
    blas = getattr(backend, "name", None)
    describe = getattr(backend, "describe", None)
    reason = describe() if callable(describe) else None
    return (f"{name} ({blas})" if blas and kind == "cpu" else name), reason


def _quantized(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())


def resolve_execution(model: nn.Module, backend: Any = None) -> ExecutionPlan:
    """Choose packed mixed iterations when the architecture has a packed runner, else separate passes.

    `backend` is a BLAS description (engine.backend.BlasInfo), a string, or None. Raises nothing.
    """
    ok, why = packed_support(model)
    mechanism, backend_reason = _mechanism(backend)
    reasons = [why]
    if backend_reason:
        reasons.append(backend_reason)
    if _quantized(model):
        reasons.append("quantized weights: linear layers run quantized matmuls")
    features = ["continuous-batching", "chunked-prefill", "token-budget", "per-row-kv"]
    if ok:
        features.append("mixed-iterations")
        reasons.append("decode rows and prefill chunks share one forward; attention split per row")
    else:
        reasons.append("each row runs its own forward pass; prefill and decode alternate")
    return ExecutionPlan(PACKED_MIXED if ok else SEPARATE_PASSES, mechanism, tuple(features), reasons)
