"""LLMBatchGroup: parity with mlx-lm's own greedy generation under continuous batching, chunked prefill,
the token budget, admission, cancellation, the prefix-cache seam and failure isolation."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import anyio
import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors

from engine.batch import LLMBatchGroup
from engine.contracts import Delta, GenerationRequest, SamplingParams
from engine.driver import iteration_budget
from engine.plan import SEPARATE_PASSES, ExecutionPlan

pytestmark = pytest.mark.anyio
GREEDY = SamplingParams(temperature=0.0)


class InlineContext:
    """Runs each step inline, so the test decides exactly what happens in which iteration."""

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class RecordingRunner:
    """Wraps the group's runner and records each iteration's segments as (tokens, wants_logits)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.iterations: list[list[tuple[int, bool]]] = []
        # Per iteration: whether it carried a prompt chunk (a segment without a decode slot) beside decoding rows. A
        # prompt's last chunk may be one token long, which its length alone does not tell from a decode token.
        self.mixed: list[bool] = []

    def forward(self, segments):
        self.iterations.append([(len(s.tokens), s.logits) for s in segments])
        self.mixed.append(any(s.slot is None for s in segments) and any(s.slot is not None for s in segments))
        return self.inner.forward(segments)


def make_group(loaded, **kw) -> LLMBatchGroup:
    """A group stepped by hand: one step per `iterate` (no decode bursts), prompts mixed into the iterations (no
    prefill lane, which a GPU turns on by default: on the H200 these tests saw no mixed step) unless a test asks."""
    kw.setdefault("decode_burst", 1)
    kw.setdefault("prefill_lane", False)
    group = LLMBatchGroup(loaded.model, loaded.tokenizer, InlineContext(), context_length=loaded.context_length, **kw)
    group.step.runner = RecordingRunner(group.step.runner)
    return group


async def iterate(group: LLMBatchGroup) -> None:
    """One driver iteration (engine/driver.py's loop body)."""
    group.prune()
    if group.tasks.pending:
        await group.tasks.advance(group.context)
    group.admit()
    if group.has_decoding() and group.has_preparing() and group.supports_mixed():
        await group.advance_mixed(iteration_budget(group))
    elif group.has_preparing():
        await group.advance_preparation()
    elif group.has_decoding():
        await group.advance()


def drain(stream) -> list[Delta]:
    out = []
    while True:
        try:
            out.append(stream.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return out


def tokens_of(deltas: list[Delta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def reference(model, prompt: list[int], n: int) -> list[int]:
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=n)]


def prompt_of(length: int, salt: int) -> list[int]:
    return [3 + (salt * 31 + i * 17) % 390 for i in range(length)]


def assert_matches_reference(loaded, prompt, got: list[int], n: int) -> None:
    ref = reference(loaded.model, prompt, n)
    eos = loaded.tokenizer.eos_token_ids
    assert got == ref[: len(got)]
    assert len(got) == n or got[-1] in eos


async def run_rows(group, requests, join_at, max_iterations=500):
    """Submit request i at iteration join_at[i]; iterate until all finish. Returns deltas per request."""
    streams: dict[int, Any] = {}
    deltas: dict[int, list[Delta]] = {i: [] for i in range(len(requests))}
    for it in range(max_iterations):
        for i, at in enumerate(join_at):
            if at == it:
                streams[i] = group.submit(requests[i])
        await iterate(group)
        for i, s in streams.items():
            deltas[i] += drain(s)
        if len(streams) == len(requests) and all(d and d[-1].finish_reason for d in deltas.values()):
            return deltas
    raise AssertionError("rows did not finish")


async def test_greedy_alone_matches_mlx_lm(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    prompt = tiny_loaded.tokenizer.encode("Hello world! This is")
    deltas = (await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=24)], [0]))[0]
    assert_matches_reference(tiny_loaded, prompt, tokens_of(deltas), 24)
    assert [d.finish_reason for d in deltas].count(None) == len(deltas) - 1
    assert group.active_rows() == 0 and group.kv_bytes() == 0


async def test_four_rows_joining_at_different_iterations_match_mlx_lm(tiny_loaded) -> None:
    # Each mixed step read as it lands, as on a CPU (on a GPU one stays in flight and lands with the next:
    # tests/engine/test_pipeline.py counts those).
    group = make_group(tiny_loaded, keep_mixed_in_flight=False)
    prompts = [prompt_of(n, i) for i, n in enumerate((3, 11, 25, 40))]
    reqs = [GenerationRequest(p, GREEDY, max_tokens=16) for p in prompts]
    deltas = await run_rows(group, reqs, [0, 2, 5, 9])
    for p, d in zip(prompts, deltas.values()):
        assert_matches_reference(tiny_loaded, p, tokens_of(d), 16)
    mixed = [it for it, m in zip(group.step.runner.iterations, group.step.runner.mixed) if m]
    assert mixed, "a joining prompt must share an iteration with decoding rows"
    assert group.counters["mixed_iterations"] == len(mixed)
    times = group.iteration_times.snapshot()  # /stats: iteration wall times by kind
    assert times["mixed"]["n"] == len(mixed) and times["decode"]["n"] > 0 and times["prefill"]["n"] > 0
    assert 0 < times["decode"]["p50_ms"] <= times["decode"]["p99_ms"] <= times["decode"]["max_ms"]
    # What each step did once is named, so a slow one can be told apart: four rows attached a cache, moved
    # into decode slots (growing them) and finished.
    seen = {k: sum(times[kind]["slow"]["events_all"].get(k, 0) for kind in ("decode", "mixed", "prefill"))
            for k in ("attach", "adopt", "grow", "rows")}
    assert seen["attach"] >= 1 and seen["adopt"] >= 1 and seen["grow"] >= 1 and seen["rows"] >= 2, seen
    # ... and where each kind's engine time went: a mixed step built a forward, sampled, launched, accepted tokens.
    assert {"prepare", "forward", "sample", "launch", "accept", "read"} <= set(times["mixed"]["phases"])


async def test_prefill_split_into_budgeted_chunks_matches_mlx_lm(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_iteration_tokens=8, minimum_preparation_tokens=4)
    prompt = prompt_of(45, 7)
    deltas = (await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=10)], [0]))[0]
    chunks = [it[0][0] for it in group.step.runner.iterations[:6]]
    assert chunks == [8, 8, 8, 8, 8, 5]  # a prompt larger than the budget runs in chunks, never rejected
    assert_matches_reference(tiny_loaded, prompt, tokens_of(deltas), 10)


async def test_a_short_prompt_behind_a_long_one_is_read_in_the_next_iteration(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_iteration_tokens=8, minimum_preparation_tokens=4)
    prompts = [prompt_of(45, 1), prompt_of(3, 2)]
    reqs = [GenerationRequest(p, GREEDY, max_tokens=6) for p in prompts]
    deltas = await run_rows(group, reqs, [0, 1])
    for p, d in zip(prompts, deltas.values()):
        assert_matches_reference(tiny_loaded, p, tokens_of(d), 6)
    # Beside the long prompt's chunk, not after its 45 tokens (engine/rows.py prefill_shares).
    assert group.step.runner.iterations[1] == [(5, False), (3, True)]


async def test_packed_and_separate_passes_agree(tiny_loaded) -> None:
    prompts = [prompt_of(n, i) for i, n in enumerate((5, 19, 2))]
    reqs = lambda: [GenerationRequest(p, GREEDY, max_tokens=12) for p in prompts]  # noqa: E731
    packed = make_group(tiny_loaded, max_iteration_tokens=6)
    separate = make_group(tiny_loaded, max_iteration_tokens=6,
                          plan=ExecutionPlan(SEPARATE_PASSES, "mlx-cpu", (), ["forced for the test"]))
    assert packed.supports_mixed() and not separate.supports_mixed()
    a = await run_rows(packed, reqs(), [0, 1, 3])
    b = await run_rows(separate, reqs(), [0, 1, 3])
    assert [tokens_of(d) for d in a.values()] == [tokens_of(d) for d in b.values()]


async def test_budget_below_one_token_per_row_still_makes_progress(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_iteration_tokens=2, minimum_preparation_tokens=3)
    prompts = [prompt_of(4, i) for i in range(4)] + [prompt_of(20, 9)]
    reqs = [GenerationRequest(p, GREEDY, max_tokens=12) for p in prompts]
    deltas = await run_rows(group, reqs, [0, 0, 0, 0, 6])
    for p, d in zip(prompts, deltas.values()):
        assert_matches_reference(tiny_loaded, p, tokens_of(d), 12)
    # With 4 rows decoding, every one of them decodes and the late prompt still gets 3 tokens per iteration.
    mixed = [it for it in group.step.runner.iterations if len(it) == 5]
    assert mixed and all(sorted(n for n, _ in it)[:4] == [1, 1, 1, 1] and max(n for n, _ in it) == 3
                         for it in mixed[:5])


async def test_cancelled_row_is_freed_within_one_iteration_and_others_continue(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    prompts = [prompt_of(n, i) for i, n in enumerate((6, 9, 12))]
    streams = [group.submit(GenerationRequest(p, GREEDY, max_tokens=20)) for p in prompts]
    deltas: list[list[Delta]] = [[], [], []]
    for _ in range(5):
        await iterate(group)
        for i, s in enumerate(streams):
            deltas[i] += drain(s)
    kv_before = group.kv_bytes()
    victim = group._active[1]
    await streams[1].aclose()
    await iterate(group)
    assert victim not in group._active and victim.cache is None and victim.slot is None
    assert group.active_rows() == 2 and group.kv_bytes() < kv_before
    assert group.counters["cancelled_rows"] == 1
    for _ in range(40):
        await iterate(group)
        for i in (0, 2):
            deltas[i] += drain(streams[i])
    for i in (0, 2):
        assert deltas[i][-1].finish_reason is not None
        assert_matches_reference(tiny_loaded, prompts[i], tokens_of(deltas[i]), 20)
    assert group.active_rows() == 0


async def test_deltas_carry_usage_and_exactly_one_finish(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    prompt = prompt_of(7, 1)
    deltas = (await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=9)], [0]))[0]
    last = deltas[-1]
    assert [d.finish_reason is not None for d in deltas].count(True) == 1
    assert (last.prompt_tokens, last.completion_tokens, last.cached_tokens) == (7, len(tokens_of(deltas)), 0)
    assert last.finish_reason in ("length", "stop")
    completions = [d.completion_tokens for d in deltas]
    assert completions == sorted(completions)


async def test_stop_string_ends_the_row_and_is_not_emitted(tiny_loaded) -> None:
    prompt = tiny_loaded.tokenizer.encode("The quick brown fox")
    free = (await run_rows(make_group(tiny_loaded), [GenerationRequest(prompt, GREEDY, max_tokens=24)], [0]))[0]
    full = "".join(d.text for d in free)
    stop = next(full[i : i + 3] for i in range(4, len(full)) if full[i : i + 3].isalpha())
    group = make_group(tiny_loaded)
    deltas = (await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=24, stop=[stop])], [0]))[0]
    assert deltas[-1].finish_reason == "stop"
    assert "".join(d.text for d in deltas) == full[: full.index(stop)]
    assert tokens_of(deltas) == tokens_of(free)[: len(tokens_of(deltas))]


async def test_logprobs_go_with_the_text_shown_and_not_past_a_stop_string(tiny_loaded) -> None:
    # Each token's log probability is sent once its whole text has shown: held while it may begin a stop string,
    # never when the stop string cut it, even where part of its text shows (" Paris" of a reply cut to " ").
    prompt = tiny_loaded.tokenizer.encode("The quick brown fox")
    asked = SamplingParams(temperature=0.0, logprobs=1)
    free = (await run_rows(make_group(tiny_loaded), [GenerationRequest(prompt, asked, max_tokens=24)], [0]))[0]
    tokens, full = tokens_of(free), "".join(d.text for d in free)
    detok = tiny_loaded.tokenizer.detokenizer
    ends = []
    for t in tokens:  # where each token's text ends in the reply
        detok.add_token(t)
        ends.append(len(detok.text))
    starts = [0] + ends[:-1]
    # A stop string that starts inside a token: that token's text shows in part.
    cut = next(i for i in range(6, len(full) - 3) if full[i:i + 3].isalpha() and full.find(full[i:i + 3]) == i
               and any(a < i < b for a, b in zip(starts, ends)))
    stop = full[cut:cut + 3]
    deltas = (await run_rows(make_group(tiny_loaded), [GenerationRequest(prompt, asked, max_tokens=24, stop=[stop])],
                             [0]))[0]
    assert "".join(d.text for d in deltas) == full[:cut]
    sent = [lp.token for d in deltas for lp in d.logprobs]
    assert sent == [t for t, end in zip(tokens, ends) if end <= cut]
    assert len(sent) < len(tokens_of(deltas))  # the stop string's own tokens had none sent
    # Sent with the delta that shows the last of their text: never ahead of it.
    sent_so_far, shown = 0, 0
    for d in deltas:
        shown += len(d.text)
        for _ in d.logprobs:
            assert ends[sent_so_far] <= shown
            sent_so_far += 1


async def test_seeded_row_is_reproducible_regardless_of_batch_mates(tiny_loaded) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    prompt = prompt_of(8, 3)
    alone = await run_rows(make_group(tiny_loaded), [GenerationRequest(prompt, seeded, max_tokens=16)], [0])
    mates = [GenerationRequest(prompt_of(n, n), SamplingParams(temperature=1.0), max_tokens=16) for n in (3, 14)]
    crowd = await run_rows(make_group(tiny_loaded), [mates[0], GenerationRequest(prompt, seeded, max_tokens=16),
                                                     mates[1]], [0, 1, 2])
    assert tokens_of(alone[0]) == tokens_of(crowd[1])
    other_seed = SamplingParams(temperature=1.0, top_p=0.95, seed=99)
    other = await run_rows(make_group(tiny_loaded), [GenerationRequest(prompt, other_seed, max_tokens=16)], [0])
    assert tokens_of(other[0]) != tokens_of(alone[0])


async def test_an_xtc_row_is_seeded_like_any_other_and_drops_the_top_choices(tiny_loaded) -> None:
    # XTC's coin from the row's own key: the same reply beside batch mates; at probability 1 its reply differs from
    # the same seed's without XTC (the top choices dropped).
    prompt = prompt_of(8, 3)

    def xtc(threshold: float, probability: float = 1.0) -> GenerationRequest:
        return GenerationRequest(prompt, SamplingParams(temperature=0.7, seed=11, xtc_probability=probability,
                                                        xtc_threshold=threshold), max_tokens=16)

    alone = await run_rows(make_group(tiny_loaded), [xtc(0.02)], [0])
    mates = [GenerationRequest(prompt_of(n, n), SamplingParams(temperature=1.0), max_tokens=16) for n in (3, 14)]
    crowd = await run_rows(make_group(tiny_loaded), [mates[0], xtc(0.02), mates[1]], [0, 1, 2])
    assert tokens_of(alone[0]) == tokens_of(crowd[1])
    without = await run_rows(make_group(tiny_loaded), [xtc(0.02, probability=0.0)], [0])
    assert tokens_of(without[0]) != tokens_of(alone[0])


async def test_penalty_windows_match_mlx_lms_processors_beside_rows_without(tiny_loaded) -> None:
    # mlx_lm.server's *_context_size: each windowed row's greedy reply is generate_step's under mlx-lm's own
    # processors (penalties over the last N of prompt + reply), its batch mates' settings its own. The prompt opens
    # with what the model would write next, so a window that leaves it out and one that takes it in answer apart.
    start = prompt_of(9, 2)
    prompt = reference(tiny_loaded.model, start, 12) + start
    windowed = [dict(repetition_penalty=3.0, repetition_context_size=4),
                dict(presence_penalty=2.0, presence_context_size=0, frequency_penalty=2.0, frequency_context_size=3)]
    mate = GenerationRequest(prompt_of(7, 4), SamplingParams(temperature=0.0, repetition_penalty=1.6), max_tokens=16)
    requests = [GenerationRequest(prompt, SamplingParams(temperature=0.0, **w), max_tokens=16)
                for w in windowed]
    deltas = await run_rows(make_group(tiny_loaded), [requests[0], mate, requests[1]], [0, 0, 1])
    for settings, got in zip(windowed, (deltas[0], deltas[2])):
        processors = make_logits_processors(**settings)
        ref = [int(t) for t, _ in generate_step(mx.array(prompt), tiny_loaded.model, max_tokens=16,
                                                logits_processors=processors)]
        assert tokens_of(got) == ref[: len(tokens_of(got))] and len(tokens_of(got)) > 8
        assert ref != reference(tiny_loaded.model, prompt, 16)  # the penalties changed the reply


async def test_logprobs_match_a_direct_forward_and_leave_batch_mates_alone(tiny_loaded) -> None:
    prompt = prompt_of(9, 5)
    asked = SamplingParams(temperature=0.0, logprobs=3)
    mates = [GenerationRequest(prompt_of(n, n), GREEDY, max_tokens=12) for n in (4, 17)]
    alone = await run_rows(make_group(tiny_loaded), mates, [0, 0])
    group = make_group(tiny_loaded, keep_mixed_in_flight=True)
    # The row's steps are pipelined like its mates': launched on tokens not yet read (the values queue beside them).
    build, on_unread = group.step.pipeline.build, []

    def spy(rows, fed):
        on_unread.append(fed is not None and any(r.sampler.params.logprobs for r in rows))
        return build(rows, fed)

    group.step.pipeline.build = spy  # type: ignore[method-assign]
    crowd = await run_rows(group, [mates[0], GenerationRequest(prompt, asked, max_tokens=12), mates[1]], [0, 1, 3])
    assert sum(on_unread) >= 5
    assert [tokens_of(crowd[0]), tokens_of(crowd[2])] == [tokens_of(alone[0]), tokens_of(alone[1])]
    assert all(not d.logprobs for i in (0, 2) for d in crowd[i])
    tokens = tokens_of(crowd[1])
    reported = [lp for d in crowd[1] for lp in d.logprobs]
    eos = set(tiny_loaded.tokenizer.eos_token_ids)
    assert [lp.token for lp in reported] == [t for t in tokens if t not in eos]  # a stop token has none
    # The model's own distribution over the whole sequence, in one forward.
    logits = tiny_loaded.model(mx.array([prompt + tokens]))[0].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    for i, lp in enumerate(reported):
        row = logp[len(prompt) - 1 + i]
        assert lp.logprob == pytest.approx(float(row[lp.token]), abs=2e-3)
        assert [t for t, _ in lp.top] == [int(t) for t in mx.argsort(-row)[:3].tolist()]
        assert lp.top[0] == (lp.token, pytest.approx(lp.logprob))  # greedy: the likeliest


async def test_max_active_limits_admission(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_active=2)
    streams = [group.submit(GenerationRequest(prompt_of(4, i), GREEDY, max_tokens=3 + i)) for i in range(3)]
    await iterate(group)
    assert (group.active_rows(), group.queued_rows()) == (2, 1)
    for _ in range(20):
        await iterate(group)
    assert all(drain(s)[-1].finish_reason for s in streams)


def test_submit_rejects_what_cannot_run(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    with pytest.raises(ValueError, match="exceeds the context"):
        group.submit(GenerationRequest(prompt_of(2000, 1), GREEDY, max_tokens=100))
    with pytest.raises(ValueError, match="empty"):
        group.submit(GenerationRequest([], GREEDY))
    with pytest.raises(ValueError, match="token ids"):
        group.submit(GenerationRequest([1, 400], GREEDY))
    with pytest.raises(ValueError, match="max_tokens"):
        group.submit(GenerationRequest([1, 2], GREEDY, max_tokens=0))
    with pytest.raises(ValueError, match="top_p"):
        group.submit(GenerationRequest([1, 2], SamplingParams(top_p=0)))
    assert group.queued_rows() == 0


async def test_a_failing_step_fails_its_rows_not_the_group(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    real = group.step.runner

    class Boom:
        def forward(self, segments):
            raise RuntimeError("kaboom")

    group.step.runner = Boom()
    stream = group.submit(GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=4))
    await iterate(group)
    (delta,) = drain(stream)
    assert delta.finish_reason == "error" and "kaboom" in (delta.error or "")
    group.step.runner = real
    deltas = (await run_rows(group, [GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=4)], [0]))[0]
    assert deltas[-1].finish_reason in ("length", "stop")


async def test_a_rows_own_fault_ends_only_that_row(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    streams = [group.submit(GenerationRequest(prompt_of(5, i), GREEDY, max_tokens=6)) for i in range(3)]
    bad = streams[1]._row

    def broken(token, at_context_limit=False):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad byte")

    bad.stopper.add = broken  # type: ignore[method-assign]
    got: dict[int, list[Delta]] = {i: [] for i in range(3)}
    for _ in range(30):
        await iterate(group)
        for i, st in enumerate(streams):
            got[i] += drain(st)
    assert got[1][-1].finish_reason == "error" and "bad byte" in (got[1][-1].error or "")
    for i in (0, 2):
        assert_matches_reference(tiny_loaded, prompt_of(5, i), tokens_of(got[i]), 6)
    assert group.health.ok


async def test_steps_failing_in_a_row_make_the_group_unhealthy_until_one_succeeds(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    real = group.step.runner

    class Boom:
        def forward(self, segments):
            raise RuntimeError("device lost")

    group.step.runner = Boom()
    streams = []  # held: a dropped stream cancels its row
    for i in range(3):
        streams.append(group.submit(GenerationRequest(prompt_of(5, i), GREEDY, max_tokens=2)))
        await iterate(group)
        assert drain(streams[-1])[-1].finish_reason == "error"
    assert not group.health.ok and "device lost" in (group.health.last_error or "")
    group.step.runner = real
    await run_rows(group, [GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=2)], [0])
    assert group.health.ok


class FakePrefixCache:
    """Stores the KV handed over at row end; `take` returns it when its tokens prefix the new prompt."""

    def __init__(self) -> None:
        self.entries: list[tuple[tuple[int, ...], list]] = []
        self.stored: list[tuple[tuple[int, ...], list]] = []  # every put, taken or not
        self.takes: list[tuple[str, int, str | None]] = []
        self.reclaims = 0

    def take(self, namespace, tokens, session_id=None):
        self.takes.append((namespace, len(tokens), session_id))
        for stored, kv in self.entries:
            if len(stored) < len(tokens) and tuple(tokens[: len(stored)]) == stored:
                self.entries.remove((stored, kv))
                return len(stored), kv
        return 0, None

    def put(self, namespace, tokens, kv, session_id=None, *, system_prefix=False):
        assert all(c.offset == len(tokens) for c in kv), "put tokens must match the KV they describe"
        # as PrefixCache.put: the positions past those an entry put before held (a take hands the KV out here)
        held = max((len(t) for t, _ in self.stored if tuple(tokens[:len(t)]) == t), default=0)
        self.entries.append((tuple(tokens), kv))
        self.stored.append((tuple(tokens), kv))
        return range(held, len(tokens))

    def reclaim(self):
        self.reclaims += 1

    def settle(self, *, keep_latest=False):
        return 0  # its entries are the caches themselves: nothing started, nothing to wait for

    def copies_held(self):
        return contextlib.nullcontext()  # no copies to hold back either

    def has_pending(self):
        return False


async def test_prefix_cache_seam_reuses_kv_and_changes_nothing(tiny_loaded) -> None:
    cache = FakePrefixCache()
    group = make_group(tiny_loaded, prefix_cache=cache)
    first = prompt_of(12, 2)
    d1 = (await run_rows(group, [GenerationRequest(first, GREEDY, max_tokens=6, namespace="m", session_id="s")],
                         [0]))[0]
    gen = tokens_of(d1)
    assert len(cache.entries) == 1 and cache.entries[0][0] == tuple(first + gen[:-1])
    second = first + gen + prompt_of(5, 8)
    d2 = (await run_rows(group, [GenerationRequest(second, GREEDY, max_tokens=8, namespace="m", session_id="s")],
                         [0]))[0]
    assert d2[-1].cached_tokens == len(first) + len(gen) - 1
    # what each wrote into the cache: its prompt past what it read there, told with its end
    assert (d1[-1].cache_write_tokens, d2[-1].cache_write_tokens) == (len(first), len(second) - d2[-1].cached_tokens)
    assert all(d.cache_write_tokens == 0 for d in d1[:-1] + d2[:-1])
    assert cache.takes[0] == ("m", 12, "s") and cache.reclaims > 0
    cold = (await run_rows(make_group(tiny_loaded), [GenerationRequest(second, GREEDY, max_tokens=8)], [0]))[0]
    assert tokens_of(d2) == tokens_of(cold)


async def test_rows_count_only_the_prompt_tokens_the_cache_did_not_hold_as_written(tiny_loaded) -> None:
    # A seeded sampled row reads nothing from the cache (reproducibility) yet writes only what it did not hold: its
    # system prefix, cached by an earlier request, was counted as written (36 of 36). Two such rows sharing a prompt
    # write it once between them; the same request again writes nothing.
    from engine.prefix_cache import PrefixCache

    group = make_group(tiny_loaded, prefix_cache=PrefixCache(1 << 24))
    system, prompt = prompt_of(10, 1), prompt_of(10, 1) + prompt_of(6, 2)
    seeded = SamplingParams(temperature=0.7, seed=5)
    first = await run_rows(group, [GenerationRequest(system + prompt_of(4, 3), GREEDY, max_tokens=3,
                                                     segment_boundaries=(10,))], [0])
    assert first[0][-1].cache_write_tokens == 14
    both = [GenerationRequest(prompt, seeded, max_tokens=3, segment_boundaries=(10,)) for _ in range(2)]
    for expected in (6, 0):
        deltas = await run_rows(group, both, [0, 0])
        assert [d[-1].cached_tokens for d in deltas.values()] == [0, 0]
        assert sum(d[-1].cache_write_tokens for d in deltas.values()) == expected


async def test_cancelled_row_hands_its_kv_to_the_prefix_cache_next_step(tiny_loaded) -> None:
    cache = FakePrefixCache()
    group = make_group(tiny_loaded, prefix_cache=cache)
    victim = group.submit(GenerationRequest(prompt_of(9, 4), GREEDY, max_tokens=30))
    other = group.submit(GenerationRequest(prompt_of(3, 5), GREEDY, max_tokens=30))
    for _ in range(3):
        await iterate(group)
    await victim.aclose()
    await iterate(group)
    assert len(cache.entries) == 1 and len(cache.entries[0][0]) == 9 + 2  # prompt + fed generated tokens
    assert drain(other)
    group.close()
    assert drain(other)[-1].finish_reason == "cancelled"


async def test_a_cancelled_last_row_leaves_work_until_its_kv_is_stored(tiny_loaded) -> None:
    cache = FakePrefixCache()
    group = make_group(tiny_loaded, prefix_cache=cache)
    only = group.submit(GenerationRequest(prompt_of(6, 4), GREEDY, max_tokens=30))
    await iterate(group)
    await only.aclose()
    group.prune()
    assert group.active_rows() == 0 and group.has_work()  # the put task keeps the driver awake
    await iterate(group)
    assert not group.has_work() and [len(t) for t, _ in cache.entries] == [6]


async def test_kv_budget_holds_admission_until_room(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_kv_tokens=30)
    first = group.submit(GenerationRequest(prompt_of(10, 1), GREEDY, max_tokens=10))
    second = group.submit(GenerationRequest(prompt_of(10, 2), GREEDY, max_tokens=10))
    await iterate(group)
    assert (group.active_rows(), group.queued_rows()) == (1, 1)  # 20 + 20 > 30
    for _ in range(30):
        await iterate(group)
    assert drain(first)[-1].finish_reason and drain(second)[-1].finish_reason


async def test_a_dropped_stream_cancels_its_row(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    group.submit(GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=30))  # the stream is dropped at once
    await iterate(group)
    await iterate(group)
    assert group.active_rows() == 0 and group.counters["cancelled_rows"] == 1


async def test_an_architecture_without_a_packed_runner_runs_separate_passes(tmp_path) -> None:
    from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm

    gemma = load_tiny_llm(build_tiny_llm(tmp_path, model_type="gemma"))
    group = make_group(gemma)
    assert group.plan.method == "separate-passes" and not group.supports_mixed()
    assert any("model_type gemma has no packed runner" in r for r in group.plan.reasons)
    prompts = [prompt_of(n, i) for i, n in enumerate((6, 15, 3))]
    deltas = await run_rows(group, [GenerationRequest(p, GREEDY, max_tokens=10) for p in prompts], [0, 1, 4])
    for p, d in zip(prompts, deltas.values()):
        assert_matches_reference(gemma, p, tokens_of(d), 10)


async def test_a_hybrid_model_whose_layers_keep_state_prefills_in_chunks(tmp_path) -> None:
    # LFM2-style: a convolution layer (recurrent state, no keys or values) before an attention layer. A prompt longer
    # than the iteration's budget runs chunks without logits, whose caches a step names to evaluate: it read
    # `.keys` off every layer's cache and failed each such request (500, "'ArraysCache' object has no attribute").
    from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm

    lfm2 = load_tiny_llm(build_tiny_llm(tmp_path, model_type="lfm2", extra_config={
        "norm_eps": 1e-5, "conv_bias": False, "conv_L_cache": 3, "block_dim": 64, "block_ff_dim": 128,
        "block_multiple_of": 32, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
        "full_attn_idxs": [1], "layer_types": ["conv", "full_attention"]}))
    group = make_group(lfm2, max_iteration_tokens=8, minimum_preparation_tokens=4)
    prompt = prompt_of(30, 2)
    deltas = await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=8)], [0])
    assert deltas[0][-1].error is None
    assert_matches_reference(lfm2, prompt, tokens_of(deltas[0]), 8)


MAMBA = {"architectures": ["MambaForCausalLM"], "state_size": 8, "conv_kernel": 4, "use_bias": False,
         "use_conv_bias": True, "time_step_rank": 4}


async def test_a_state_space_model_runs_separate_passes_as_mlx_lm_does(tmp_path) -> None:
    # Mamba: every layer a recurrent state, no attention. Rows of different lengths joining at different steps.
    from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm

    mamba = load_tiny_llm(build_tiny_llm(tmp_path, model_type="mamba", extra_config=MAMBA))
    group = make_group(mamba, max_iteration_tokens=16)
    assert group.plan.method == "separate-passes"
    prompts = [prompt_of(n, i) for i, n in enumerate((6, 40, 3))]
    deltas = await run_rows(group, [GenerationRequest(p, GREEDY, max_tokens=8) for p in prompts], [0, 1, 3])
    for p, d in zip(prompts, deltas.values()):
        assert d[-1].error is None
        assert_matches_reference(mamba, p, tokens_of(d), 8)


async def test_a_task_enqueued_while_the_group_goes_idle_wakes_it(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    woke = anyio.Event()

    async def idle() -> None:
        await group.wait_for_work()
        woke.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(idle)
        await anyio.sleep(0)  # idle() checks has_work() and schedules its watchers, which have not run yet
        group.tasks.enqueue(lambda: None, label="window")
        with anyio.fail_after(10):  # a guard against hanging, not synchronisation
            await woke.wait()


async def test_prompt_chunks_beside_decoding_rows_are_paced(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_iteration_tokens=256, minimum_preparation_tokens=8, prefill_stall=2.0)
    first = group.submit(GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=40))
    await iterate(group)  # its prompt: it decodes from now on
    pacer = group.pacer  # measured: 20 prompt tokens fit
    pacer.decode_seconds, pacer.token_seconds, pacer.fixed_seconds = 0.004, 0.0002, 0.0
    second = group.submit(GenerationRequest(prompt_of(120, 2), GREEDY, max_tokens=4))
    await iterate(group)
    assert group.step.runner.iterations[-1] == [(1, True), (20, False)]  # one decode token, a 20-token chunk
    drain(first), drain(second)
