"""Packed mixed forward vs mlx-lm's own per-row forward: same logits, same KV, any mix of rows."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.utils import load

from engine.runner import PackedRunner, Segment, SeparateRunner, make_cache, packed_support
from tests.fixtures.tiny_llm import build_tiny_llm

PROMPTS = [[5 + (i * 7 + j * 3) % 300 for j in range(n)] for i, n in enumerate((9, 1, 17, 4))]


def run_schedule(runner, model, schedule):
    """schedule: iterations, each a list of (row, tokens, want_logits). Returns (logits per iteration, caches)."""
    caches = [make_cache(model) for _ in PROMPTS]
    out = []
    for it in schedule:
        logits = runner.forward([Segment(tokens, caches[r], want) for r, tokens, want in it])
        touched = [a for r, _, _ in it for c in caches[r] for a in (c.keys, c.values)]
        mx.eval(([logits] if logits is not None else []) + touched)
        out.append(logits)
    return out, caches


P = PROMPTS
# Prefill pieces; then prefill tails + whole prompts; then decode rows next to a late prompt; then decode only.
SCHEDULE = [
    [(0, P[0][:4], False), (2, P[2][:6], False)],
    [(0, P[0][4:], True), (1, P[1], True), (2, P[2][6:12], False)],
    [(0, [11], True), (1, [12], True), (2, P[2][12:], True), (3, P[3], True)],
    [(0, [21], True), (1, [22], True), (2, [23], True), (3, [24], True)],
]


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory):
    model, _ = load(str(build_tiny_llm(tmp_path_factory.mktemp("qwen3"), model_type="qwen3")))
    return model


def reference(model, schedule):
    """mlx-lm's model(x, cache=...) one row at a time."""
    return run_schedule(SeparateRunner(model), model, schedule)


def assert_close(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        assert a.shape == b.shape
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item(), float(mx.abs(a - b).max())


def test_packed_matches_separate_passes_llama(tiny_loaded) -> None:
    model = tiny_loaded.model
    schedule = SCHEDULE
    got, got_caches = run_schedule(PackedRunner(model), model, schedule)
    ref, ref_caches = reference(model, schedule)
    for a, b in zip(got, ref):
        assert_close(a, b)
    for cs, rs in zip(got_caches, ref_caches):
        for c, r in zip(cs, rs):
            assert c.offset == r.offset
            assert mx.allclose(c.keys[..., : c.offset, :], r.keys[..., : r.offset, :], atol=1e-5).item()


def test_packed_matches_separate_passes_qwen3_with_qk_norm(qwen3_model) -> None:
    schedule = SCHEDULE
    got, _ = run_schedule(PackedRunner(qwen3_model), qwen3_model, schedule)
    ref, _ = reference(qwen3_model, schedule)
    for a, b in zip(got, ref):
        assert_close(a, b)


@pytest.mark.parametrize("rope_scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"type": "dynamic", "factor": 2.0},  # its RoPE cannot take per-token offsets: per-row RoPE path
])
def test_packed_matches_separate_passes_with_rope_scaling(tmp_path, rope_scaling) -> None:
    model, _ = load(str(build_tiny_llm(tmp_path, extra_config={"rope_scaling": rope_scaling})))
    got, _ = run_schedule(PackedRunner(model), model, SCHEDULE)
    ref, _ = reference(model, SCHEDULE)
    for a, b in zip(got, ref):
        assert_close(a, b)


def test_packed_works_with_quantized_modules(tiny_llm_dir) -> None:
    model, _ = load(str(tiny_llm_dir))
    nn.quantize(model, group_size=32, bits=8)
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    schedule = SCHEDULE
    got, _ = run_schedule(PackedRunner(model), model, schedule)
    ref, _ = reference(model, schedule)
    for a, b in zip(got, ref):
        assert_close(a, b)


def test_logits_only_for_rows_that_sample(tiny_loaded) -> None:
    model = tiny_loaded.model
    caches = [make_cache(model) for _ in range(3)]
    runner = PackedRunner(model)
    logits = runner.forward([Segment([1, 2, 3], caches[0], False), Segment([4, 5], caches[1], True),
                             Segment([6], caches[2], True)])
    assert logits.shape == (2, model.args.vocab_size)
    assert runner.forward([Segment([7, 8], caches[0], False)]) is None
    assert [c[0].offset for c in caches] == [5, 2, 1]


def test_last_position_logits_equal_a_full_forward(tiny_loaded) -> None:
    model = tiny_loaded.model
    tokens = PROMPTS[2]
    full = model(mx.array(tokens)[None])[0, -1:]
    packed = PackedRunner(model).forward([Segment(tokens, make_cache(model), True)])
    assert_close(packed, full)


def test_packed_support_names_the_reason(tiny_loaded) -> None:
    ok, reason = packed_support(tiny_loaded.model)
    assert ok and "packed runner available" in reason

    class Odd(nn.Module):
        model_type = "gpt2"

    ok, reason = packed_support(Odd())
    assert not ok and "gpt2" in reason and "separate passes" in reason
    with pytest.raises(ValueError):
        PackedRunner(Odd())


def test_slot_rows_fed_one_lazy_array_beside_a_prompt_chunk_match_given_tokens(tiny_loaded) -> None:
    # A mixed step chained onto a step in flight feeds its decode rows one unread (rows,) array, slot order.
    model = tiny_loaded.model

    def run(feed: str) -> mx.array:
        runner = PackedRunner(model)
        slots = []
        for p in PROMPTS[:3]:
            cache = make_cache(model)
            mx.eval(runner.forward([Segment(p, cache, True)]))
            slots.append(runner.slots.adopt(cache))
        tokens = [31, 32, 33]
        block = mx.array(tokens, mx.uint32) + 0  # lazy, the dtype argmax gives
        segments = [Segment([0] if feed != "ints" else [t], None, True, s,
                            block if feed == "block" else block[i:i + 1] if feed == "rows" else None)
                    for i, (t, s) in enumerate(zip(tokens, slots))]
        segments.append(Segment(PROMPTS[3], make_cache(model), True))
        return runner.forward(segments)

    given = run("ints")
    assert_close(run("block"), given)
    assert_close(run("rows"), given)
    with pytest.raises(ValueError, match="lazy tokens need slot segments"):
        PackedRunner(model).forward([Segment([1, 2], make_cache(model), True, None, mx.array([1]))])
