"""The fused matrix-vector kernels (engine/fused_gemv.py): where they may serve, and on CUDA what they compute and
that a served engine runs its few-row decode steps through them (their default there). The CUDA tests skip
elsewhere; bench/gpu/compile_h200.sh runs them on the H200."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine import fused_gemv
from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm

ON_CUDA = mx.default_device().type == mx.DeviceType.gpu and mx.cuda.is_available()
cuda_only = pytest.mark.skipif(not ON_CUDA, reason="the kernels run on CUDA only")


@pytest.mark.parametrize("gpu", [True, False])  # Metal's GPU, a CPU
def test_never_served_without_cuda_whatever_the_switch(monkeypatch, gpu: bool) -> None:
    monkeypatch.setattr(fused_gemv, "on_gpu", lambda: gpu)
    monkeypatch.setattr(fused_gemv.mx.cuda, "is_available", lambda: False)
    for choice in ("on", "auto", "off"):
        monkeypatch.setenv("TANDEM_FUSED_GEMV", choice)
        assert not fused_gemv.enabled()
        assert not fused_gemv.available(mx.bfloat16, 2048, 8192, 1)


def test_the_fused_kernels_serve_by_default_on_cuda_only(monkeypatch) -> None:
    # Over HTTP on the H200 they served every scenario faster (bench/RESULTS.md): on by default, off by the switch.
    monkeypatch.setattr(fused_gemv, "on_gpu", lambda: True)
    monkeypatch.setattr(fused_gemv.mx.cuda, "is_available", lambda: True)
    monkeypatch.delenv("TANDEM_FUSED_GEMV", raising=False)
    assert fused_gemv.enabled()
    monkeypatch.setenv("TANDEM_FUSED_GEMV", "off")
    assert not fused_gemv.enabled()
    monkeypatch.setenv("TANDEM_FUSED_GEMV", "on")
    assert fused_gemv.enabled()
    monkeypatch.setattr(fused_gemv, "_checked", {(mx.bfloat16, 2048, 8192, 1): True})
    assert fused_gemv.available(mx.bfloat16, 2048, 8192, 1)
    assert not fused_gemv.available(mx.bfloat16, 2048, 8192, fused_gemv.MAX_ROWS + 1)
    assert not fused_gemv.available(mx.float32, 2048, 8192, 1)  # 16-byte loads of 2-byte floats
    assert not fused_gemv.available(mx.bfloat16, 576, 1536, 1)  # widths in whole 256s only


def test_unasked_only_models_up_to_the_measured_width_get_them(monkeypatch) -> None:
    # Measured faster on the 1B shape (2,048 wide); an 8B one (4,096) waits on the device, where the kernels read slower.
    monkeypatch.delenv("TANDEM_FUSED_GEMV", raising=False)
    assert fused_gemv.suits(576) and fused_gemv.suits(2048) and not fused_gemv.suits(4096)
    monkeypatch.setenv("TANDEM_FUSED_GEMV", "on")  # asked for: any width
    assert fused_gemv.suits(4096)


def test_a_wide_model_keeps_mlx_ops_unless_asked(tmp_path, monkeypatch, stand_in_kernels) -> None:
    from engine.runner import PackedRunner

    monkeypatch.setenv("TANDEM_DECODE_COMPILE", "on")
    monkeypatch.delenv("TANDEM_FUSED_GEMV", raising=False)
    monkeypatch.setattr(fused_gemv, "AUTO_MAX_HIDDEN", 128)  # the tiny llama (256 wide) stands for an 8B one
    model = load_tiny_llm(build_tiny_llm(tmp_path, hidden_size=256, intermediate_size=768)).model
    unasked = PackedRunner(model).compiled
    assert unasked is not None and unasked._plain is None
    monkeypatch.setenv("TANDEM_FUSED_GEMV", "on")
    asked = PackedRunner(model).compiled
    assert asked is not None and asked._plain == (256, 768)


def test_the_reference_is_the_llama_layer_ops() -> None:
    from mlx_lm.models.activations import swiglu

    keys = mx.random.split(mx.random.key(3), 6)
    x, h = (mx.random.normal((2, 32), key=keys[i]) for i in (0, 1))
    g = 1 + 0.1 * mx.random.normal((32,), key=keys[2])
    w_qkv, w_gu, w_down = (mx.random.normal(s, key=keys[3 + i]) for i, s in enumerate([(24, 32), (96, 32), (32, 48)]))
    got = fused_gemv.reference(x, g, 1e-5, w_qkv, w_gu, w_down, h)
    n = mx.fast.rms_norm(x, g, 1e-5)
    a = swiglu(n @ w_gu[:48].T, n @ w_gu[48:].T)
    for u, v in zip(got, [n @ w_qkv.T, a, h + a @ w_down.T]):
        assert mx.allclose(u, v, rtol=1e-5, atol=1e-5).item()


@cuda_only
@pytest.mark.parametrize("rows", range(1, fused_gemv.MAX_ROWS + 1))
@pytest.mark.parametrize("widths", [(2048, 8192), (256, 768)])
def test_the_kernels_match_mlx_ops_on_cuda(monkeypatch, rows: int, widths: tuple[int, int]) -> None:
    # The self-test is the comparison (relative error <= 2e-2 against `reference`); run afresh, then as served.
    monkeypatch.delenv("TANDEM_FUSED_GEMV", raising=False)  # the default
    hidden, inter = widths
    assert fused_gemv._self_test(mx.bfloat16, hidden, inter, rows)
    assert fused_gemv.available(mx.bfloat16, hidden, inter, rows)


async def serve_bf16_llama(tmp_path) -> tuple[int, str | None, dict]:
    """A tiny llama cast to bf16 with widths in 256s, served (TANDEM_FUSED_GEMV unset): 16 greedy tokens. Returns
    (tokens, the last finish reason, /stats compiled_decode)."""
    import anyio

    from engine.contracts import GenerationRequest, SamplingParams
    from engine.runtime import Engine
    from tests.engine.test_runtime import prompt_of

    loaded = load_tiny_llm(build_tiny_llm(tmp_path, hidden_size=256, intermediate_size=768, num_heads=4,
                                          num_kv_heads=2))
    loaded.model.set_dtype(mx.bfloat16)  # the kernels read 2-byte floats, as real checkpoints hold them
    mx.eval(loaded.model.parameters())  # cast here: lazy casts would belong to this thread's stream, not the engine's
    engine = Engine(loaded, memory_budget=1 << 30)
    greedy = SamplingParams(temperature=0.0, logit_bias={loaded.tokenizer.eos_token_id: -100.0})  # all 16 tokens
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        async with engine.submit(GenerationRequest(prompt_of(7, 4), greedy, max_tokens=16)) as stream:
            deltas = [d async for d in stream]
        stats = engine.stats()["compiled_decode"]
        engine.close()
    return sum(len(d.token_ids) for d in deltas), deltas[-1].finish_reason, stats


@pytest.mark.anyio
async def test_a_served_engine_counts_the_steps_the_kernels_ran(tmp_path, monkeypatch, stand_in_kernels) -> None:
    # Any machine: compiled steps forced on, MLX's ops standing in for the kernels (the wiring to /stats).
    monkeypatch.setenv("TANDEM_DECODE_COMPILE", "on")
    monkeypatch.delenv("TANDEM_FUSED_GEMV", raising=False)
    tokens, finish, stats = await serve_bf16_llama(tmp_path)
    assert (tokens, finish) == (16, "length")
    assert stats["on"] and stats["fused_steps"] >= 15  # every decode step after the prompt's


@cuda_only
@pytest.mark.anyio
async def test_a_served_bf16_llama_decodes_through_the_kernels_by_default(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TANDEM_FUSED_GEMV", raising=False)
    tokens, finish, stats = await serve_bf16_llama(tmp_path)
    assert (tokens, finish) == (16, "length")
    assert stats["on"] and stats["fused_steps"] >= 10  # the decode steps after the first few ran through them
