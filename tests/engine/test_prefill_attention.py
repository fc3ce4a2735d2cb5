"""engine/prefill_attention.py: a prompt chunk's attention as one strided batch equals MLX's attention, and the
runner takes it when told to."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.prefill_attention import grouped_attention, grouped_causal_mask, grouped_enabled


@pytest.mark.parametrize(("heads", "kv", "tokens", "keys", "dtype"), [
    (8, 2, 5, 5, mx.float32), (8, 2, 5, 13, mx.float32), (4, 4, 7, 9, mx.float32), (6, 1, 3, 300, mx.float32),
    (8, 2, 16, 40, mx.bfloat16)])
def test_equals_mlx_attention_with_a_causal_mask(heads: int, kv: int, tokens: int, keys: int, dtype: mx.Dtype) -> None:
    rng = np.random.default_rng(heads * keys)
    q, k, v = (mx.array(rng.normal(0, 1, (1, n, t, 16)).astype(np.float32)).astype(dtype)
               for n, t in ((heads, tokens), (kv, keys), (kv, keys)))
    ours = grouped_attention(q, k, v, 0.25, grouped_causal_mask(tokens, keys, heads // kv))
    theirs = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    tol = 2e-2 if dtype == mx.bfloat16 else 1e-5
    np.testing.assert_allclose(np.array(ours.astype(mx.float32)), np.array(theirs.astype(mx.float32)), atol=tol)


def test_the_mask_is_causal_for_each_head_of_the_group() -> None:
    m = np.array(grouped_causal_mask(2, 4, 3))
    one = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)  # queries at positions 2 and 3
    assert m.shape == (6, 4) and (m == np.tile(one, (3, 1))).all()


def test_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANDEM_PREFILL_ATTENTION", raising=False)
    assert not grouped_enabled()
    monkeypatch.setenv("TANDEM_PREFILL_ATTENTION", "grouped")
    assert grouped_enabled()


def test_the_runner_takes_it_for_one_rows_prompt_chunks_and_gives_the_same_logits(
        tiny_loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    # one row's prompt in three chunks (the prefill lane's jobs), then a decode token: same logits and the same
    # KV as MLX's attention, and every chunk of more than one token went through grouped_attention
    from engine import runner as runner_module
    from engine.runner import PackedRunner, Segment, make_cache

    model = tiny_loaded.model
    calls: list[tuple[int, ...]] = []

    def spy(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
        calls.append(tuple(q.shape))
        return grouped_attention(q, k, v, scale, mask)

    monkeypatch.setattr(runner_module, "grouped_attention", spy)
    chunks = [[5 + i % 300 for i in range(n, n + 7)] for n in (0, 7, 14)] + [[42]]
    results = []
    for mode in ("sdpa", "grouped"):
        monkeypatch.setenv("TANDEM_PREFILL_ATTENTION", mode)
        runner, cache = PackedRunner(model), make_cache(model)
        logits = [runner.forward([Segment(c, cache, True)]) for c in chunks]
        mx.eval(logits)
        results.append((logits, cache))
    (ref, ref_cache), (got, got_cache) = results
    for a, b in zip(got, ref):
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item(), float(mx.abs(a - b).max())
    assert mx.allclose(got_cache[0].keys[..., :22, :], ref_cache[0].keys[..., :22, :], atol=1e-5).item()
    layers = len(model.layers)
    assert len(calls) == 3 * layers and calls[0][2] == 7
