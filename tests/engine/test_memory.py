"""MemoryBudget and memory admission: the budget's split, rows queued while their KV does not fit, a row
that never fits refused, a defaulted max_tokens lowered to fit, and slot buffers that shrink as rows leave."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.contracts import GenerationRequest, SamplingParams
from engine.errors import MemoryAdmission
from engine.memory import MemoryBudget, kv_token_bytes, weight_bytes
from tests.engine.test_batch import (assert_matches_reference, drain, iterate, make_group, prompt_of, run_rows,
                                    tokens_of)

pytestmark = pytest.mark.anyio
GREEDY = SamplingParams(temperature=0.0)


def budget_for(loaded, kv_tokens: int) -> MemoryBudget:
    """A budget whose KV share holds exactly `kv_tokens` positions."""
    token = kv_token_bytes(loaded.model)
    return MemoryBudget(total=kv_tokens * token, weights=0, prefix_cache=0, buffer_cache=0, activations=0,
                        kv_token_bytes=token)


def test_kv_token_bytes_follow_the_attention_shape(tiny_loaded) -> None:
    args = tiny_loaded.model.args
    head_dim = args.hidden_size // args.num_attention_heads
    assert kv_token_bytes(tiny_loaded.model) == 2 * args.num_hidden_layers * args.num_key_value_heads * head_dim * 4


def test_kv_token_bytes_of_attention_without_a_k_proj_come_from_the_config(tmp_path) -> None:
    # Phi-3 fuses q, k and v into one qkv_proj: sizing the KV from `k_proj` failed the whole start-up
    # ("could not load model: AttributeError"), though mlx-lm serves the model.
    from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm

    phi3 = load_tiny_llm(build_tiny_llm(tmp_path, model_type="phi3", num_heads=4, num_kv_heads=2))
    assert not hasattr(phi3.model.model.layers[0].self_attn, "k_proj")
    assert kv_token_bytes(phi3.model) == 2 * 2 * 2 * 16 * 4  # keys and values, 2 layers, 2 kv heads of 16, float32


def test_kv_token_bytes_of_latent_or_renamed_attention_come_from_the_config() -> None:
    # DeepSeek's latent attention (mlx-lm caches every head's keys and values), and attention under another name
    # (GPT-NeoX's `attention`), sized from the config; bf16 parameters: 2 bytes.
    from types import SimpleNamespace

    import mlx.nn as nn

    class Stub(nn.Module):
        def __init__(self, args: SimpleNamespace) -> None:
            super().__init__()
            self.args = args
            self.layers = [nn.Linear(4, 4) for _ in range(3)]
            self.set_dtype(mx.bfloat16)

    mla = Stub(SimpleNamespace(num_attention_heads=4, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16))
    assert kv_token_bytes(mla) == 3 * 4 * (16 + 8 + 16) * 2
    neox = Stub(SimpleNamespace(num_attention_heads=4, hidden_size=64))
    assert kv_token_bytes(neox) == 3 * 2 * 4 * 16 * 2
    with pytest.raises(ValueError, match="size the KV"):
        kv_token_bytes(Stub(SimpleNamespace()))


def test_the_budget_counts_weights_and_refuses_one_without_room_for_kv(tiny_loaded) -> None:
    weights = weight_bytes(tiny_loaded.model)
    budget = MemoryBudget.plan(tiny_loaded.model, total=1 << 30, prefix_cache=1 << 20)
    assert budget.weights == weights > 0
    assert budget.kv == budget.total - weights - (1 << 20) - budget.buffer_cache - budget.activations > 0
    with pytest.raises(ValueError, match="memory-budget") as refused:
        MemoryBudget.plan(tiny_loaded.model, total=weights + (1 << 20))
    # the budget leaves the prefix cache nothing: lowering --prompt-cache-bytes cannot help, so it is not advised
    assert "lower --prompt-cache-bytes" not in str(refused.value) and "takes none" in str(refused.value)
    with pytest.raises(ValueError, match="lower --prompt-cache-bytes"):
        MemoryBudget.plan(tiny_loaded.model, total=weights + (1 << 20), prefix_cache=1 << 20)


def test_the_default_budget_follows_the_process_cgroup_memory_limit(tiny_loaded, tmp_path, monkeypatch) -> None:
    # A container's 2 GiB v1 limit on its own cgroup: the budget once took 60 % of the host's RAM and the kernel
    # OOM-killed the worker under 8 long streams.
    from engine import cgroup_limits
    from tests.engine.test_cgroup_limits import GIB, v1_tree

    monkeypatch.setattr(cgroup_limits, "ROOT", str(v1_tree(tmp_path, memory=2 * GIB)))
    monkeypatch.setattr(mx, "default_device", lambda: mx.cpu)
    budget = MemoryBudget.plan(tiny_loaded.model)
    assert budget.total == int(2 * GIB * 0.6)
    assert budget.source == "60% of the cgroup's memory limit (2.0 GiB)"


def test_a_row_that_can_never_fit_is_refused_with_its_code(tiny_loaded) -> None:
    group = make_group(tiny_loaded, budget=budget_for(tiny_loaded, 1024))
    with pytest.raises(MemoryAdmission, match="budget") as info:
        group.submit(GenerationRequest(prompt_of(100, 1), GREEDY, max_tokens=1000))
    assert info.value.code == "context_over_budget"
    group.submit(GenerationRequest(prompt_of(100, 1), GREEDY, max_tokens=200))  # this one fits


def test_a_prompt_that_alone_cannot_fit_is_named_with_the_longest_that_can(tiny_loaded) -> None:
    # 1,024 positions: a prompt holds its prefill cache and its slot while it is read, so ~500 prompt tokens fit,
    # not the 1,024 the budget holds (the message once quoted only that, and named max_tokens).
    group = make_group(tiny_loaded, budget=budget_for(tiny_loaded, 1024))
    longest = group.admission.longest_prompt()
    with pytest.raises(MemoryAdmission, match=f"at most {longest} prompt tokens fit") as info:
        group.submit(GenerationRequest(prompt_of(700, 1), GREEDY, max_tokens=1))
    assert info.value.param == "prompt" and 256 < longest < 1024 // 2 + 1
    group.submit(GenerationRequest(prompt_of(longest, 1), GREEDY, max_tokens=1))  # the longest does fit
    with pytest.raises(MemoryAdmission) as info:
        group.submit(GenerationRequest(prompt_of(longest + 1, 1), GREEDY, max_tokens=1))
    assert info.value.param == "prompt"
    with pytest.raises(MemoryAdmission) as info:
        group.submit(GenerationRequest(prompt_of(100, 1), GREEDY, max_tokens=1000))
    assert info.value.param == "max_tokens"  # a smaller max_tokens would fit


async def test_a_defaulted_max_tokens_is_lowered_to_what_fits(tiny_loaded) -> None:
    group = make_group(tiny_loaded, budget=budget_for(tiny_loaded, 1024))
    stream = group.submit(GenerationRequest(prompt_of(100, 1), GREEDY, max_tokens=1900, max_tokens_requested=False))
    # Alone it may use 1024 positions less its 256-rounded prefill cache, step-rounded, less one.
    assert stream._row.request.max_tokens == 768 - 1 - 100


async def test_a_row_waits_while_its_kv_does_not_fit_and_runs_when_room_is_made(tiny_loaded) -> None:
    # One row of 40 + 20 tokens needs a 256-position slot + a 256-position prefill cache; two rows need at
    # least two slots + one prefill cache (768): a 700-position budget holds one at a time.
    group = make_group(tiny_loaded, budget=budget_for(tiny_loaded, 700))
    first = group.submit(GenerationRequest(prompt_of(40, 1), GREEDY, max_tokens=20))
    second = group.submit(GenerationRequest(prompt_of(40, 2), GREEDY, max_tokens=20))
    got: dict[int, list] = {0: [], 1: []}
    order: list[tuple[int, int]] = []  # (iteration, row) whenever a row produced a token
    for it in range(200):
        await iterate(group)
        for i, s in enumerate((first, second)):
            new = drain(s)
            if tokens_of(new):
                order.append((it, i))
            got[i] += new
        if got[1] and got[1][-1].finish_reason:
            break
    first_done = max(it for it, i in order if i == 0)
    assert min(it for it, i in order if i == 1) > first_done  # the second only ran once the first left
    assert group.reserved_kv_bytes() == 0
    assert_matches_reference(tiny_loaded, prompt_of(40, 2), tokens_of(got[1]), 20)


async def test_slot_buffers_shrink_when_rows_leave_and_the_rest_keep_their_kv(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    group.step.slots.step = 8
    lengths = [(30, 4), (12, 5), (20, 6), (9, 40)]  # the last row outlives the others
    streams = [group.submit(GenerationRequest(prompt_of(p, i), GREEDY, max_tokens=m))
               for i, (p, m) in enumerate(lengths)]
    got: dict[int, list] = {i: [] for i in range(4)}
    peak, checked = 0, False
    for _ in range(200):
        await iterate(group)
        peak = max(peak, group.slot_bytes())
        for i, s in enumerate(streams):
            got[i] += drain(s)
        if all(g and g[-1].finish_reason for g in got.values()):
            break
        if all(got[i] and got[i][-1].finish_reason for i in range(3)) and len(tokens_of(got[3])) >= 30:
            assert group.step.slots.slots == 1  # compacted to the one row left
            assert group.slot_bytes() < peak
            checked = True
    for i, (p, m) in enumerate(lengths):
        assert_matches_reference(tiny_loaded, prompt_of(p, i), tokens_of(got[i]), m)
    assert checked and group.slot_bytes() == 0


def test_a_request_of_the_longest_size_fits_however_it_splits(tiny_loaded) -> None:
    # What /v1/models advertises as the context under a memory budget: every request up to it must run.
    group = make_group(tiny_loaded, budget=budget_for(tiny_loaded, 1024))
    longest = group.admission.longest_request()
    assert longest == group.admission.longest_prompt() + 1 < 1024
    for prompt in (1, 100, longest // 2, longest - 1):
        group.submit(GenerationRequest(prompt_of(prompt, 1), GREEDY, max_tokens=longest - prompt))
    with pytest.raises(MemoryAdmission):  # one more token, all prompt: refused
        group.submit(GenerationRequest(prompt_of(longest, 1), GREEDY, max_tokens=1))


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3_5", "qwen3_5_moe"])
async def test_a_qwen3_5_checkpoint_is_sized_from_its_attention_layers_and_runs(tmp_path, moe: bool) -> None:
    # Qwen3.5's first layer is a linear-attention one (no `self_attn`) and its settings sit under `text_config`:
    # sizing the KV failed the start ("neither attention layers nor a config to size the KV cache from"), though
    # mlx-lm serves the checkpoint. kv_token_bytes charges its attention layer's width for every layer; the budget
    # charges what its caches hold (tests/engine/test_kv_shape.py).
    from engine.models import load_model
    from tests.fixtures.tiny_hybrid import build_tiny_qwen3_5

    loaded = load_model(str(build_tiny_qwen3_5(tmp_path / "qwen3_5", moe=moe)))
    assert not hasattr(loaded.model.model.layers[0], "self_attn")
    assert kv_token_bytes(loaded.model) == 4 * 2 * 2 * 16 * 4  # 4 layers, keys and values, 2 kv heads of 16, float32
    budget = MemoryBudget.plan(loaded.model, total=1 << 30)
    assert budget.activations < 160 << 20  # from its 64-wide text settings (a 4,096-wide default: ~400 MiB)
    group = make_group(loaded, budget=budget)
    assert group.vocab_size == 448  # the logits' width (its text settings'), not the tokenizer's 400 ids
    prompts = [prompt_of(n, i) for i, n in enumerate((40, 7))]
    deltas = await run_rows(group, [GenerationRequest(p, GREEDY, max_tokens=8) for p in prompts], [0, 0])
    for p, got in zip(prompts, deltas.values()):
        assert_matches_reference(loaded, p, tokens_of(got), 8)

