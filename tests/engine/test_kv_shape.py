"""A row's KV charged by how its caches grow (engine/kv_shape.py): Qwen3.5's Gated DeltaNet states, gpt-oss's and
Gemma's sliding windows and Gemma 4's KV-shared layers are charged what they hold, not a full-attention layer's bytes a
token each, and what admission projects for a row stays above what its caches really hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import pytest

from engine.contracts import GenerationRequest, SamplingParams
from engine.errors import MemoryAdmission
from engine.kv_shape import KVShape, kv_shape
from engine.memory import MemoryBudget
from engine.models import load_model
from tests.engine.test_batch import assert_matches_reference, drain, iterate, make_group, prompt_of, tokens_of
from tests.fixtures.tiny_hybrid import build_tiny_qwen3_5
from tests.fixtures.tiny_llm import build_tiny_llm

pytestmark = pytest.mark.anyio
GREEDY = SamplingParams(temperature=0.0)
CHUNK = 64  # prompt tokens an iteration feeds: what a sliding window holds past its size while a chunk is written
WINDOW = 64
LONG = 900  # fourteen windows


def _gemma3(path: Path) -> Path:  # two sliding layers per global one
    return build_tiny_llm(path, model_type="gemma3_text", num_layers=6, extra_config={
        "architectures": ["Gemma3ForCausalLM"], "sliding_window": WINDOW, "sliding_window_pattern": 3, "head_dim": 16,
        "query_pre_attn_scalar": 16})


def _gpt_oss(path: Path) -> Path:  # sliding and full layers in turn
    return build_tiny_llm(path, model_type="gpt_oss", num_layers=4, extra_config={
        "architectures": ["GptOssForCausalLM"], "sliding_window": WINDOW, "num_local_experts": 4,
        "num_experts_per_tok": 2, "layer_types": ["sliding_attention", "full_attention"] * 2, "head_dim": 16})


def _gemma4(path: Path) -> Path:  # the last two layers read earlier layers' KV: they own no cache
    return build_tiny_llm(path, model_type="gemma4_text", num_layers=6, extra_config={
        "architectures": ["Gemma4ForCausalLM"], "sliding_window": WINDOW, "head_dim": 16, "global_head_dim": 32,
        "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 400,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2, "use_double_wide_mlp": False})


BUILDS: dict[str, Callable[[Path], Path]] = {"qwen3_5": build_tiny_qwen3_5, "gemma3": _gemma3, "gpt_oss": _gpt_oss,
                                             "gemma4": _gemma4, "llama": build_tiny_llm}
_LOADED: dict[str, Any] = {}


def _loaded(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if kind not in _LOADED:
        _LOADED[kind] = load_model(str(BUILDS[kind](tmp_path_factory.mktemp(kind))))
    return _LOADED[kind]


F32 = 4
A_TOKEN = 2 * 2 * 16 * F32  # keys and values of 2 kv heads of 16, float32: one layer's bytes a token


@pytest.mark.parametrize("kind, shape", [
    # three Gated DeltaNet layers' states (a 3-position convolution over 128 channels, 4 heads of 16 x 16) and one
    # full-attention layer: charged 4 x A_TOKEN a token before
    ("qwen3_5", KVShape(A_TOKEN, state_bytes=3 * (3 * 128 + 4 * 16 * 16) * F32)),
    ("gemma3", KVShape(2 * A_TOKEN, window_token_bytes=4 * A_TOKEN, window_bytes=4 * A_TOKEN * (WINDOW + CHUNK))),
    ("gpt_oss", KVShape(2 * A_TOKEN, window_token_bytes=2 * A_TOKEN, window_bytes=2 * A_TOKEN * (WINDOW + CHUNK))),
    # one global layer of head_dim 32, three sliding ones; the two KV-shared layers hold nothing
    ("gemma4", KVShape(2 * A_TOKEN, window_token_bytes=3 * A_TOKEN, window_bytes=3 * A_TOKEN * (WINDOW + CHUNK))),
])
def test_the_shape_comes_from_the_caches_the_model_makes(kind: str, shape: KVShape,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    loaded = _loaded(kind, tmp_path_factory)
    assert kv_shape(loaded.model, CHUNK) == shape
    budget = MemoryBudget.plan(loaded.model, total=1 << 30, max_iteration_tokens=CHUNK)
    assert budget.kv_shape == shape and budget.as_dict()["kv_row_bytes"] == shape.row_bytes  # /stats shows both


def test_every_layer_a_kv_cache_keeps_the_charge_it_had(tiny_loaded) -> None:
    # llama's packed path: every layer keeps every token, sized as ever (engine/memory.py's kv_token_bytes)
    from engine.memory import kv_token_bytes

    assert kv_shape(tiny_loaded.model, CHUNK) is None
    budget = MemoryBudget.plan(tiny_loaded.model, total=1 << 30)
    assert budget.kv_shape == KVShape(kv_token_bytes(tiny_loaded.model))


def test_the_probe_leaves_the_model_as_it_found_it() -> None:
    # The probe's forward runs on whatever thread plans the budget: an array a module kept from it could not be
    # evaluated on the engine thread (MLX streams are per thread).
    from mlx_lm.models.cache import ArraysCache

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = [nn.Linear(4, 4)]

        def make_cache(self) -> list[Any]:
            return [ArraysCache(size=1)]

        def __call__(self, x: mx.array, cache: list[Any]) -> mx.array:
            cache[0][0] = mx.zeros((1, 8, 4))
            self.stash = self.layers[0].weight = self.layers[0].weight + 1  # kept on the modules
            return x

    model = Recurrent()
    weight = model.layers[0].weight
    assert kv_shape(model, CHUNK) == KVShape(0, state_bytes=8 * 4 * F32)
    assert not hasattr(model, "stash") and model.layers[0].weight is weight


@pytest.mark.parametrize("kind", ["qwen3_5", "gemma3", "gpt_oss", "gemma4", "llama"])
async def test_a_long_rows_caches_stay_within_what_admission_projects(kind: str,
                                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    # Fourteen windows of prompt, then decoding: at every step the row's caches (their arrays' bytes) stay within
    # what admission reserves for it, and at the end a hybrid's or a sliding model's reservation is near them (every
    # layer charged per token reserved 3.8x, 2.7x, 1.9x and 2.7x what Qwen3.5's, Gemma 3's, gpt-oss's and Gemma 4's
    # held).
    loaded = _loaded(kind, tmp_path_factory)
    budget = MemoryBudget.plan(loaded.model, total=1 << 30, max_iteration_tokens=CHUNK)
    group = make_group(loaded, budget=budget, max_iteration_tokens=CHUNK)
    stream = group.submit(GenerationRequest(prompt_of(LONG, 1), GREEDY, max_tokens=24))
    got: list[Any] = []
    held = reserved = 0
    for _ in range(200):
        await iterate(group)
        got += drain(stream)
        if group.active_rows():
            held, reserved = group.row_cache_bytes() + group.slot_bytes(), group.reserved_kv_bytes()
            assert 0 < held <= reserved, (held, reserved)
        if got and got[-1].finish_reason:
            break
    assert len(tokens_of(got)) == 24
    if kind != "llama":  # its packed slots and prefill caches are charged as ever
        assert reserved <= 1.5 * held, (reserved, held)


def _tight_total(loaded: Any, held: int) -> int:
    """A memory budget whose KV share is 1.5 times `held` bytes (the weights, activations and MLX's 64 MiB buffer
    cache besides)."""
    roomy = MemoryBudget.plan(loaded.model, total=1 << 30, prefix_cache=0, max_iteration_tokens=CHUNK)
    return roomy.weights + roomy.activations + (64 << 20) + int(1.5 * held)


async def _held(loaded: Any, prompt: list[int], max_tokens: int) -> int:
    """The most bytes the row's caches hold while `prompt` and `max_tokens` new tokens run alone."""
    group = make_group(loaded, max_iteration_tokens=CHUNK)
    stream = group.submit(GenerationRequest(prompt, GREEDY, max_tokens=max_tokens))
    most, got = 0, []
    while not (got and got[-1].finish_reason):
        await iterate(group)
        most = max(most, group.row_cache_bytes())
        got += drain(stream)
    return most


async def test_a_hybrid_prompt_its_caches_hold_runs_and_one_past_the_budget_is_refused(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # A budget 1.5 times what a 900-token Qwen3.5 prompt's caches hold: charging each of its 4 layers per token let no
    # prompt in at all; twice as long a prompt still does not fit, and is refused naming the limit.
    loaded = _loaded("qwen3_5", tmp_path_factory)
    prompt = prompt_of(LONG, 2)
    tight = MemoryBudget.plan(loaded.model, total=_tight_total(loaded, await _held(loaded, prompt, 8)),
                              prefix_cache=0, max_iteration_tokens=CHUNK)
    group = make_group(loaded, budget=tight, max_iteration_tokens=CHUNK)
    assert LONG < group.admission.longest_prompt() < 2 * LONG
    stream = group.submit(GenerationRequest(prompt, GREEDY, max_tokens=8))
    got: list[Any] = []
    while not (got and got[-1].finish_reason):
        await iterate(group)
        got += drain(stream)
    assert_matches_reference(loaded, prompt, tokens_of(got), 8)
    longest = group.admission.longest_prompt()
    with pytest.raises(MemoryAdmission, match=f"at most {longest} prompt tokens fit") as refused:
        group.submit(GenerationRequest(prompt_of(2 * LONG, 3), GREEDY, max_tokens=8))
    assert (refused.value.code, refused.value.param) == ("context_over_budget", "prompt")
