"""Engine facade: serve + submit on the real engine thread, cancellation by scope, stats, tasks, close."""

from __future__ import annotations

import os
import random
import re
import sys
import threading
from typing import Any

import anyio
import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from engine.contracts import GenerationRequest, SamplingParams
from engine.gil import GIL_SWITCH_SECONDS
from engine.runtime import Engine, generate_stream
from engine.tasks import TaskRejected

pytestmark = pytest.mark.anyio
GREEDY = SamplingParams(temperature=0.0)


def prompt_of(length: int, salt: int) -> list[int]:
    return [3 + (salt * 31 + i * 17) % 390 for i in range(length)]


def reference(model, prompt, n):
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=n)]


async def test_concurrent_streams_match_mlx_lm_on_the_engine_thread(tiny_loaded) -> None:
    engine = Engine(tiny_loaded, max_active=4, max_iteration_tokens=16)
    prompts = [prompt_of(n, i) for i, n in enumerate((4, 30, 9, 17))]
    results: dict[int, list[int]] = {}
    threads: set[str] = set()
    original = engine.group.step.run

    def spy(*args):
        threads.add(threading.current_thread().name)
        return original(*args)

    engine.group.step.run = spy  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)

        async def consume(i: int) -> None:
            toks: list[int] = []
            async with engine.submit(GenerationRequest(prompts[i], GREEDY, max_tokens=14)) as stream:
                async for delta in stream:
                    toks += delta.token_ids
            results[i] = toks

        async with anyio.create_task_group() as clients:
            for i in range(4):
                clients.start_soon(consume, i)
        engine.close()
    assert threads == {"tandem-engine"}
    for i, p in enumerate(prompts):
        ref = reference(tiny_loaded.model, p, 14)
        assert results[i] == ref[: len(results[i])] and results[i]


async def test_leaving_the_cancel_scope_frees_the_row_within_one_step(tiny_loaded) -> None:
    engine = Engine(tiny_loaded)  # decode bursts on (the default): a cancel must still end one within a step
    doomed_rows: list[Any] = []
    late: list[int] = []  # steps started while the cancelled row still held its place (and KV)
    run = engine.group.step.run

    def counted(*args: Any) -> Any:
        if doomed_rows and doomed_rows[0].ended and doomed_rows[0] in engine.group._active:
            late.append(1)
        return run(*args)

    engine.group.step.run = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        survivor = engine.submit(GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=200))
        with anyio.CancelScope() as scope:
            async with engine.submit(GenerationRequest(prompt_of(6, 2), GREEDY, max_tokens=200)) as doomed:
                doomed_rows.append(doomed._row)
                async for _ in doomed:
                    scope.cancel()  # the client goes away mid-stream
        while engine.stats()["active_rows"] != 1:
            await survivor.__anext__()
        # The step that saw the cancel (or was running when it landed) is the last one the row is part of.
        assert len(late) <= 1
        assert engine.stats()["cancelled_rows"] == 1
        await survivor.aclose()
        engine.close()


async def test_stats_report_rows_tokens_and_plan(tiny_loaded) -> None:
    engine = Engine(tiny_loaded)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        async with engine.submit(GenerationRequest(prompt_of(10, 3), GREEDY, max_tokens=5)) as stream:
            async for _ in stream:
                pass
        stats = engine.stats()
        engine.close()
    assert stats["prompt_tokens"] == 10 and stats["generation_tokens"] >= 1
    assert stats["iterations"] >= 2 and stats["generation_tokens_per_second"] > 0
    assert stats["mixed_iterations"] == 0  # one row never decodes and prefills at once
    assert stats["iteration_times"]["mixed"] == {"n": 0} and stats["iteration_times"]["decode"]["n"] >= 1
    assert stats["recent"]["generation_tokens_per_second"] > 0
    assert stats["plan"]["method"] == "packed-mixed" and stats["plan"]["reasons"]
    assert stats["active_rows"] == 0 and stats["queued_rows"] == 0 and stats["kv_bytes"] == 0
    assert stats["model"] == tiny_loaded.name and stats["context_length"] == 2048


async def test_tasks_run_on_the_engine_thread_between_iterations(tiny_loaded) -> None:
    engine = Engine(tiny_loaded)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        name = await engine.tasks.run(lambda: threading.current_thread().name, label="probe")
        engine.close()
    assert name == "tandem-engine"
    assert engine.stats()["tasks"]["completed"] == 1


async def test_speech_only_engine_runs_tasks_and_refuses_chat() -> None:
    engine = Engine(None)
    assert engine.tokenizer is None and engine.plan is None and engine.model_name is None
    with pytest.raises(RuntimeError, match="no chat model"):
        engine.submit(GenerationRequest([1, 2]))
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        assert await engine.tasks.run(lambda: 6 * 7) == 42
        engine.close()
    assert engine.stats()["active_rows"] == 0


async def test_close_ends_rows_and_rejects_queued_tasks(tiny_loaded) -> None:
    engine = Engine(tiny_loaded)
    stream = engine.submit(GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=50))
    handle = engine.tasks.enqueue(lambda: None, label="never")
    engine.close()
    deltas = [d async for d in stream]
    assert deltas[-1].finish_reason == "cancelled"
    with pytest.raises(TaskRejected):
        await handle
    with pytest.raises(RuntimeError):
        engine.submit(GenerationRequest([1, 2]))


def test_submit_raises_when_the_context_cannot_fit(tiny_loaded) -> None:
    engine = Engine(tiny_loaded)
    try:
        with pytest.raises(ValueError, match="exceeds the context"):
            engine.submit(GenerationRequest(prompt_of(2040, 1), GREEDY, max_tokens=20))
    finally:
        engine.close()


def test_generate_stream_runs_one_generation_without_a_server(tiny_loaded) -> None:
    prompt = prompt_of(8, 4)
    seen = []
    result = anyio.run(generate_stream, Engine(tiny_loaded), GenerationRequest(prompt, GREEDY, max_tokens=12),
                       seen.append)
    assert result.token_ids == reference(tiny_loaded.model, prompt, 12)[: len(result.token_ids)]
    assert result.finish_reason in ("length", "stop") and result.completion_tokens == len(result.token_ids)
    assert "".join(d.text for d in seen) == result.text


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
async def test_serve_returns_only_after_the_engine_os_thread_is_gone(tiny_loaded) -> None:
    # A thread still running MLX's C++ thread-local destructors at interpreter exit aborts the process.
    engine = Engine(tiny_loaded)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        async with engine.submit(GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=3)) as stream:
            async for _ in stream:
                pass
        engine.close()
    assert not os.path.exists(f"/proc/self/task/{engine.thread._thread.native_id}")


async def test_many_rows_with_random_settings_and_cancels_all_end_cleanly(tiny_loaded) -> None:
    rng = random.Random(0)
    engine = Engine(tiny_loaded, max_active=5, max_iteration_tokens=24)
    endings: list[str | None] = []

    async def client(i: int) -> None:
        sampling = SamplingParams(
            temperature=rng.choice([0.0, 0.7, 1.3]), top_p=rng.choice([1.0, 0.9]), top_k=rng.choice([0, 5]),
            min_p=rng.choice([0.0, 0.05]), seed=rng.choice([None, i]), repetition_penalty=rng.choice([1.0, 1.2]),
            presence_penalty=rng.choice([0.0, 0.5]), frequency_penalty=rng.choice([0.0, 0.3]),
            logit_bias=rng.choice([None, {7: 2.0}]),
        )
        request = GenerationRequest(prompt_of(rng.randint(1, 60), i), sampling, max_tokens=rng.randint(1, 25),
                                    stop=rng.choice([(), ("e",), ("th", "x")]))
        cancel_after = rng.choice([None, 0, 1, 3])
        last = None
        with anyio.CancelScope() as scope:
            async with engine.submit(request) as stream:
                async for n, delta in _enumerate(stream):
                    last = delta
                    if cancel_after is not None and n >= cancel_after:
                        scope.cancel()
        endings.append(last.finish_reason if last and cancel_after is None else "client-cancel")

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        async with anyio.create_task_group() as clients:
            for i in range(24):
                clients.start_soon(client, i)
        # Clients are gone; one more generation proves the loop is healthy and lets prune run.
        async with engine.submit(GenerationRequest(prompt_of(4, 99), GREEDY, max_tokens=4)) as stream:
            final = [d async for d in stream]
        stats = engine.stats()
        engine.close()
    assert final[-1].finish_reason in ("stop", "length")
    assert len(endings) == 24 and set(endings) <= {"stop", "length", "client-cancel"}
    assert stats["active_rows"] == 0 and stats["queued_rows"] == 0 and stats["kv_bytes"] == 0


async def _enumerate(stream):
    n = 0
    async for item in stream:
        yield n, item
        n += 1


LLAMA3_ROPE = {"max_position_embeddings": 131072, "rope_scaling": {
    "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    """Llama 3.2's rope_scaling block, as every real Llama 3.x checkpoint carries it."""
    from tests.fixtures.tiny_llm import build_tiny_llm

    return build_tiny_llm(tmp_path_factory.mktemp("llama3"), extra_config=LLAMA3_ROPE)


async def test_a_llama3_model_loaded_on_another_thread_runs_on_the_engine_thread(llama3_dir) -> None:
    # mlx-lm's Llama3RoPE builds `_freqs` lazily at construction: MLX binds it to the loading thread's stream.
    from engine.context import EngineThread
    from engine.models import load_model

    loader = EngineThread("loader")
    try:
        loaded = await loader.run(load_model, str(llama3_dir))
    finally:
        loader.close()
    result = await generate_stream(Engine(loaded), GenerationRequest(prompt_of(12, 1), GREEDY, max_tokens=5))
    assert result.finish_reason == "length" and len(result.token_ids) == 5


async def test_open_loads_on_the_thread_that_serves(llama3_dir) -> None:
    engine = await Engine.open(str(llama3_dir), max_active=2)
    loaded_on = await engine.thread.run(lambda: threading.current_thread().name)
    assert loaded_on == "tandem-engine"
    result = await generate_stream(engine, GenerationRequest(prompt_of(9, 2), GREEDY, max_tokens=4))
    assert len(result.token_ids) == 4 and result.error is None


async def test_warm_up_runs_every_path_and_leaves_no_trace_in_the_counters(tiny_loaded, monkeypatch) -> None:
    import engine.sampling as sampling
    from engine.prefix_cache import PrefixCache

    # Both ways log probabilities are computed: over the rows of a shared draw, and beside a row sampled alone.
    logprob_paths: set[str] = set()
    shared, alone = sampling._shared_logprobs, sampling._logprobs

    def spy_shared(logits, tokens, samplers, rows):
        rows = list(rows)
        if any(samplers[i].params.logprobs is not None for i in rows):
            logprob_paths.add("shared")
        return shared(logits, tokens, samplers, rows)

    def spy_alone(*args):
        logprob_paths.add("alone")
        return alone(*args)

    monkeypatch.setattr(sampling, "_shared_logprobs", spy_shared)
    monkeypatch.setattr(sampling, "_logprobs", spy_alone)

    # The inline paths (decode, prefill, mixed): a GPU's default prefill lane would prefill beside them instead.
    engine = Engine(tiny_loaded, max_active=8, max_iteration_tokens=32, prefix_cache=PrefixCache(1 << 24),
                    prefill_lane=False)
    seen: list[str] = []
    paths: set[str] = set()
    original = engine.group.step.run

    def spy(rows, budget, decode, prefill):
        paths.add("mixed" if decode and prefill and any(r.decoding for r in rows) and any(r.preparing for r in rows)
                  else "prefill" if prefill else "decode")
        return original(rows, budget, decode, prefill)

    engine.group.step.run = spy  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        seconds = await engine.warm_up(seen.append, force=True)
        engine.close()
    # Each of the six stages says when it starts and what it took (a GPU start's time is mostly these stages).
    starts, took = seen[0::2], seen[1::2]
    assert seconds > 0 and len(starts) == len(took) == 6
    assert all(re.fullmatch(re.escape(a) + r": \d+\.\d s", b) for a, b in zip(starts, took))
    assert {"mixed", "prefill", "decode"} <= paths
    assert logprob_paths == {"shared", "alone"}
    assert engine.group.counters["iterations"] == 0 and engine.group.counters["finished_rows"] == 0
    # Its compiles are not serving costs: /stats iteration times and the pacer start from clients' work.
    times = engine.group.iteration_times.snapshot()
    assert all(times[k]["n"] == 0 for k in ("decode", "mixed", "prefill", "gap"))
    assert engine.group.pacer.decode_seconds is None
    assert engine.prefix_cache.stats()["hits"] >= 1  # the last stage continued a cached prefix


@pytest.mark.parametrize("lane", [False, True])
async def test_warm_up_takes_the_tokens_in_flight_of_the_rows_left_when_one_finishes(tiny_loaded, lane) -> None:
    # That gather (sampled ids by the rows left) was compiled only once clients came: a 3 s stall on the H200.
    engine = Engine(tiny_loaded, max_active=8, max_iteration_tokens=32, prefill_lane=lane)
    subsets: list[tuple[int, int]] = []
    original = engine.group.step._lazy_tokens

    def spy(flight, plan):
        decoders = [r for r, _, _ in plan if r.decoding]
        live = [r for r in flight.rows if not r.ended]
        if decoders and len(live) < len(flight.rows) and all(any(r is d for d in live) for r in decoders):
            subsets.append((len(flight.rows), len(decoders)))
        return original(flight, plan)

    engine.group.step._lazy_tokens = spy  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await engine.warm_up(force=True)
        engine.close()
    assert subsets, "no warm-up step went on from a step in flight after one of its rows finished"


async def test_idle_time_between_requests_is_not_counted_as_a_loop_gap(tiny_loaded) -> None:
    engine = Engine(tiny_loaded, max_active=2, prefill_lane=False)  # a lane job waited for is no step: none to spy on
    group = engine.group
    since: list[float | None] = []  # at each iteration: the previous step's end its gap would count from
    iterate = group._iterate

    async def spy(*args: Any, **kwargs: Any) -> None:
        since.append(group._last_step_end)
        await iterate(*args, **kwargs)

    group._iterate = spy  # type: ignore[method-assign]

    async def run(salt: int) -> None:
        async with engine.submit(GenerationRequest(prompt_of(6, salt), GREEDY, max_tokens=5)) as stream:
            async for _ in stream:
                pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await run(1)
        await group.settled()  # its last delta may go out before its step lands
        await anyio.wait_all_tasks_blocked()  # the driver waits for work: idle
        first_of_second = len(since)
        await run(2)
        engine.close()
    # The wait for the second request is idle time, not the event loop's: no gap is counted across it.
    assert since[first_of_second] is None and any(t is not None for t in since[first_of_second:])


async def test_a_chat_turn_ends_when_chats_next_step_lands_and_at_once_without_chat(tiny_loaded) -> None:
    engine = Engine(tiny_loaded, max_active=2)
    landings = [0]  # chat steps landed on the loop (a step's counters move on the engine thread, before it lands)
    land = engine.group._landed

    def counted(*args: Any) -> None:
        landings[0] += 1
        land(*args)

    engine.group._landed = counted  # type: ignore[method-assign]
    with anyio.fail_after(30):
        await engine.chat_turn()  # nothing is served yet: no chat to wait for
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.serve)
            await engine.chat_turn()  # serving, but no row
            steps: list[int] = []
            async with engine.submit(GenerationRequest(prompt_of(6, 1), GREEDY, max_tokens=40)) as stream:
                first = await stream.__anext__()
                assert first.error is None
                for _ in range(3):
                    before = landings[0]
                    await engine.chat_turn()
                    steps.append(landings[0] - before)
            engine.close()
            await engine.chat_turn()  # closed: at once
    assert all(n >= 1 for n in steps), steps


async def test_chat_pace_is_the_decode_iteration_time_while_rows_decode(tiny_loaded) -> None:
    engine = Engine(tiny_loaded, max_active=2)
    assert engine.chat_pace() is None
    paces: list[float | None] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        async with engine.submit(GenerationRequest(prompt_of(6, 1), GREEDY, max_tokens=12)) as stream:
            async for delta in stream:
                paces.append(engine.chat_pace())
        # A second row still in its prompt: steps planned now are paced too (its first gaps follow).
        async with engine.submit(GenerationRequest(prompt_of(6, 2), GREEDY, max_tokens=2)) as stream:
            queued_pace = engine.chat_pace()
            async for _ in stream:
                pass
        engine.close()
    assert any(p is not None and p > 0 for p in paces)
    assert queued_pace is not None and queued_pace > 0
    assert engine.chat_pace() is None


async def _switch_interval_while_serving(loaded) -> float:
    engine = Engine(loaded, max_active=2)
    seen: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        request = GenerationRequest(prompt_tokens=prompt_of(4, 0), sampling=GREEDY, max_tokens=2)
        async with engine.submit(request) as stream:
            async for _ in stream:
                seen.append(sys.getswitchinterval())
        engine.close()
    assert seen and len(set(seen)) == 1
    return seen[0]


async def test_serving_switches_the_gil_every_5_ms_and_gives_the_interval_back(tiny_loaded) -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.001)
        assert await _switch_interval_while_serving(tiny_loaded) == pytest.approx(GIL_SWITCH_SECONDS) == 0.005
        assert sys.getswitchinterval() == pytest.approx(0.001)
    finally:
        sys.setswitchinterval(before)


async def test_tandem_gil_switch_ms_sets_the_interval(tiny_loaded, monkeypatch) -> None:
    monkeypatch.setenv("TANDEM_GIL_SWITCH_MS", "0.5")
    assert await _switch_interval_while_serving(tiny_loaded) == pytest.approx(0.0005)


def test_an_engine_is_not_built_with_a_bad_tandem_gil_switch_ms(tiny_loaded, monkeypatch) -> None:
    monkeypatch.setenv("TANDEM_GIL_SWITCH_MS", "fast")
    with pytest.raises(ValueError, match="TANDEM_GIL_SWITCH_MS"):
        Engine(tiny_loaded, max_active=2)


class _GatedDecode:
    """Wraps the engine's runner: once `armed`, the next forward over decoding rows waits (on the engine thread)
    for `open`, so the test can close the engine while that step is in flight."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.armed, self.entered, self.open = inner, threading.Event(), threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, segments: Any) -> Any:
        if self.armed.is_set() and any(s.slot is not None for s in segments):
            self.armed.clear()
            self.entered.set()
            assert self.open.wait(30), "the test never opened the gate"
        return self.inner.forward(segments)


async def test_closing_while_a_step_is_in_flight_leaves_its_slots_to_it(tiny_loaded, caplog) -> None:
    # The step reads the slots it planned with; close() on the loop reset them under it (KeyError in slots.plan,
    # "engine step failed" at shutdown).
    engine = Engine(tiny_loaded, memory_budget=1 << 30)
    gate = engine.group.step.runner = _GatedDecode(engine.group.step.runner)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        stream = engine.submit(GenerationRequest([5, 6, 7, 8], SamplingParams(temperature=0.0), max_tokens=400))
        await stream.__anext__()  # decoding
        gate.armed.set()
        await anyio.to_thread.run_sync(gate.entered.wait, 30)
        engine.close()
        gate.open.set()
    assert "engine step failed" not in caplog.text, caplog.text
    assert engine.group.step.slots is None or engine.group.step.slots.nbytes == 0  # reset once the driver stopped


def test_the_context_a_request_can_use_is_what_the_memory_budget_holds(tiny_loaded) -> None:
    # --memory-budget 900M refused a 7,031-token prompt ("at most 1278 prompt tokens fit") while /v1/models, the
    # startup line and `tandem pi` said 8,192.
    from engine.memory import MIB, MemoryBudget

    roomy = Engine(tiny_loaded)
    assert roomy.max_model_len == roomy.context_length == tiny_loaded.context_length
    roomy.close()
    fixed = MemoryBudget.plan(tiny_loaded.model, total=1 << 30, prefix_cache=0)
    total = fixed.weights + fixed.activations + 64 * MIB + 1024 * fixed.kv_token_bytes  # KV for 1,024 positions
    tight = Engine(tiny_loaded, memory_budget=total)
    assert tight.budget is not None and tight.budget.kv // tight.budget.kv_token_bytes == 1024
    assert tight.max_model_len == tight.group.admission.longest_request() < tight.context_length
    assert tight.stats()["max_model_len"] == tight.max_model_len
    tight.close()
