"""resolve_execution: packed-mixed for llama-family layers, separate passes otherwise, with reasons."""

from __future__ import annotations

import mlx.nn as nn

from engine.plan import PACKED_MIXED, SEPARATE_PASSES, resolve_execution


def test_llama_gets_packed_mixed_with_a_reason(tiny_loaded) -> None:
    plan = resolve_execution(tiny_loaded.model)
    assert plan.method == PACKED_MIXED and plan.packed
    assert "llama layers: packed runner available" in plan.reasons
    assert "mixed-iterations" in plan.features
    assert plan.mechanism.startswith("mlx-")


def test_unknown_architecture_falls_back_to_separate_passes_visibly() -> None:
    class Phi(nn.Module):
        model_type = "phi3"

        def __init__(self) -> None:
            super().__init__()
            self.layers = [nn.Linear(2, 2)]

    plan = resolve_execution(Phi())
    assert plan.method == SEPARATE_PASSES and not plan.packed
    assert any("model_type phi3 has no packed runner: separate passes" in r for r in plan.reasons)
    assert "mixed-iterations" not in plan.features


def test_backend_description_is_part_of_the_plan(tiny_loaded) -> None:
    class Blas:
        name = "openblas"

        def describe(self) -> str:
            return "BLAS: openblas (/x/libopenblas.so) — test"

    import mlx.core as mx

    plan = resolve_execution(tiny_loaded.model, Blas())
    if mx.default_device().type == mx.DeviceType.cpu:  # on a GPU the mechanism is the GPU's, the BLAS unused
        assert "openblas" in plan.mechanism
    assert "BLAS: openblas (/x/libopenblas.so) — test" in plan.reasons
    assert plan.as_dict()["method"] == PACKED_MIXED


def test_quantized_model_is_noted(tiny_llm_dir) -> None:
    from mlx_lm.utils import load

    model, _ = load(str(tiny_llm_dir))
    nn.quantize(model, group_size=32, bits=4)
    plan = resolve_execution(model)
    assert plan.packed
    assert any("quantized" in r for r in plan.reasons)
