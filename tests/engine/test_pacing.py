"""PrefillPacer: prompt chunks beside decoding rows are paced so a mixed iteration lasts at most STALL
decode iterations; with nothing decoding prompts get the whole budget; with no decode cost measured, a decode-only
iteration measures one first."""

from __future__ import annotations

import pytest

from engine.pacing import REFRESH, STALL, PrefillPacer


def test_idle_uses_the_whole_budget() -> None:
    pacer = PrefillPacer(max_tokens=512, min_tokens=32)
    assert pacer.prompt_tokens(decode_rows=0) == 512
    pacer.record(0.004, prompt_tokens=0, decode_rows=8)
    pacer.record(0.020, prompt_tokens=256, decode_rows=8)
    assert pacer.prompt_tokens(decode_rows=0) == 512


def test_unmeasured_beside_decoding_rows_asks_for_a_decode_only_iteration_then_the_minimum() -> None:
    # The whole budget before anything was measured: the first long prompt after a start stalled every stream
    # for 6.8 s on a 2-core CPU (one 504-token chunk beside a decoding row). Doubling from the minimum instead
    # reached the whole budget all the same while a prompt waited (no decode-only iteration ever measured the bound).
    pacer = PrefillPacer(max_tokens=512, min_tokens=32)
    assert pacer.prompt_tokens(decode_rows=8) == 0  # decode only: measure the bound first
    pacer.record(0.1, prompt_tokens=0, decode_rows=8)
    assert pacer.prompt_tokens(decode_rows=8) == 32  # a decode cost but no mixed iteration yet: the minimum
    pacer.record(0.1 + 32 * 0.005, prompt_tokens=32, decode_rows=8)  # then the fit takes over: 0.05 s / 5 ms
    assert pacer.prompt_tokens(decode_rows=8) in (32, 64)  # paced: the minimum (10 tokens fit), or twice it to spread
    lost = PrefillPacer(max_tokens=512, min_tokens=32)  # the decode-only iterations asked for never come:
    assert [lost.prompt_tokens(decode_rows=8) for _ in range(6)] == [0, 0, 0, 32, 32, 32]  # prompts go on, unpaced


def _closed_loop(pacer: PrefillPacer, decode: float, per_token: float, iterations: int, rows: int = 1) -> list[int]:
    """A prompt waits throughout, as the scheduler runs it: what the pacer offers runs (0: a decode-only iteration),
    costing decode + per_token x its prompt tokens, and is recorded. Returns the offers."""
    offers = []
    for _ in range(iterations):
        n = pacer.prompt_tokens(decode_rows=rows)
        offers.append(n)
        pacer.record(decode + per_token * n, n, rows)
    return offers


def test_a_long_prompt_on_a_fresh_server_never_stalls_a_stream_past_the_bound() -> None:
    # Agent A's 6,919-token prompt came first, then agent B's short one decoded beside it: every iteration was mixed,
    # no decode cost was ever measured, and the chunk doubled to the whole budget (B's gaps 0.15 s ... 19.7 s, its
    # 48 tokens 167 s). Costs here are proportional to prompt tokens: 80 ms a decode step, 5 ms a prompt token.
    pacer = PrefillPacer(max_tokens=512, min_tokens=4)
    for _ in range(3):
        pacer.record(4.0, prompt_tokens=508, decode_rows=0)  # A alone: the whole budget, nothing to protect
    offers = _closed_loop(pacer, decode=0.080, per_token=0.005, iterations=60)
    assert offers[0] == 0 and offers[1] == pacer.min_tokens  # measure a decode step, then the minimum
    fit = int((STALL - 1) * 0.080 / 0.005)
    assert all(n * 0.005 <= (STALL - 1) * 0.080 + 1e-9 for n in offers)  # every mixed iteration within the bound
    assert offers[-8:].count(fit) >= 7  # and prompts get what fits (one refresh of the decode cost among them)
    assert pacer.fixed_seconds is not None and pacer.fixed_seconds < 0.001


def test_a_decode_cost_that_falls_while_a_prompt_waits_is_measured_again() -> None:
    # 8 rows decoded in 300 ms, then 7 left (a cheaper step, 100 ms) while a long prompt kept every iteration mixed:
    # chunks paced for the old step were 2.5 decode steps long until the prompt was done.
    pacer = PrefillPacer(max_tokens=512, min_tokens=2)
    _closed_loop(pacer, decode=0.300, per_token=0.005, iterations=40, rows=8)
    offers = _closed_loop(pacer, decode=0.100, per_token=0.005, iterations=40, rows=1)
    assert offers[0] == 0  # rows moved: measure first
    assert all(n * 0.005 <= (STALL - 1) * 0.100 + 1e-9 for n in offers)
    # Same rows, another process left the cores: a decode step of 40 ms, not 100. Within REFRESH mixed iterations a
    # decode-only one measures it, and chunks follow.
    offers = _closed_loop(pacer, decode=0.040, per_token=0.002, iterations=REFRESH + 30)
    assert 0 in offers[:REFRESH + 1]
    assert all(n * 0.002 <= (STALL - 1) * 0.040 + 1e-9 for n in offers[offers.index(0):])


def _simulate(pacer: PrefillPacer, decode: float, fixed: float, per_token: float, iterations: int,
              spike_at: int | None = None) -> list[int]:
    """Closed loop: 8 decoding rows; each mixed iteration costs decode + fixed + per_token x its prompt tokens
    (a compile spike of 0.3 s at `spike_at`). Returns the allowances handed out."""
    pacer.record(decode, prompt_tokens=0, decode_rows=8)
    allowances = []
    for i in range(iterations):
        n = pacer.prompt_tokens(decode_rows=8)
        allowances.append(n)
        pacer.record(decode + fixed + per_token * n + (0.3 if i == spike_at else 0.0), n, 8)
        pacer.record(decode, prompt_tokens=0, decode_rows=8)
    return allowances


def test_prompt_tokens_keep_a_mixed_iteration_within_the_stall() -> None:
    pacer = PrefillPacer(max_tokens=2048, min_tokens=32, stall=2.0)
    allowed = _simulate(pacer, decode=0.004, fixed=0.0, per_token=0.0001, iterations=12)[-1]
    assert allowed == int((2.0 - 1) * 0.004 / 0.0001)
    assert 0.004 + allowed * 0.0001 <= 2.0 * 0.004 + 1e-9


def test_a_larger_stall_gives_longer_chunks_within_it() -> None:
    pacer = PrefillPacer(max_tokens=4096, min_tokens=32, stall=3.0)
    allowed = _simulate(pacer, decode=0.004, fixed=0.005, per_token=0.00001, iterations=16)[-1]
    assert abs(allowed - (2.0 * 0.004 - 0.005) / 0.00001) <= 1  # the fit's last bits  # at a stall of 2 the fixed part alone passes
    for stall in (1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="stall"):
            PrefillPacer(max_tokens=512, min_tokens=32, stall=stall)


def test_a_fixed_cost_per_mixed_iteration_is_not_charged_per_token() -> None:
    # An H200 serving a 1B model: a mixed iteration stops the decode pipeline (~5 ms) whatever its size, and
    # each prompt token adds ~9 us. Charged per token, the 5 ms shrank the allowance to the minimum: prompts
    # arrived faster than 32-token chunks could take them in, and TTFT grew to seconds.
    pacer = PrefillPacer(max_tokens=4096, min_tokens=32, stall=2.0)
    allowed = _simulate(pacer, decode=0.008, fixed=0.005, per_token=0.000009, iterations=16)[-1]
    assert pacer.fixed_seconds is not None and abs(pacer.fixed_seconds - 0.005) < 1e-4
    assert allowed == int(((2.0 - 1) * 0.008 - 0.005) / 0.000009)
    assert 0.008 + 0.005 + allowed * 0.000009 <= 2.0 * 0.008 + 1e-9


def test_a_fixed_cost_beyond_the_stall_gets_the_whole_budget() -> None:
    pacer = PrefillPacer(max_tokens=512, min_tokens=32)
    allowed = _simulate(pacer, decode=0.004, fixed=0.006, per_token=0.00001, iterations=16)[-1]
    assert allowed == 512 - 8


def test_one_spike_does_not_move_the_allowance() -> None:
    calm = _simulate(PrefillPacer(max_tokens=4096, min_tokens=32), 0.008, 0.005, 0.000009, iterations=24)[-1]
    spiked = _simulate(PrefillPacer(max_tokens=4096, min_tokens=32), 0.008, 0.005, 0.000009, iterations=24,
                       spike_at=14)[-1]
    assert abs(spiked - calm) <= 0.05 * calm


def test_the_allowance_stays_between_the_minimum_and_the_budget() -> None:
    slow = PrefillPacer(max_tokens=512, min_tokens=32)  # a CPU: prompt tokens are expensive
    assert set(_simulate(slow, decode=0.001, fixed=0.0, per_token=0.01, iterations=12)[1:]) <= {32, 64}  # first: unmeasured
    fast = PrefillPacer(max_tokens=512, min_tokens=32)
    assert _simulate(fast, decode=0.010, fixed=0.0, per_token=0.000001, iterations=12)[-1] == 504


def test_prompt_only_iterations_do_not_count_their_fixed_cost_per_token() -> None:
    pacer = PrefillPacer(max_tokens=512, min_tokens=32)
    pacer.record(0.004, prompt_tokens=0, decode_rows=8)
    pacer.record(0.050, prompt_tokens=20, decode_rows=0)  # mostly the weights read once, not 2.5 ms a token
    assert pacer.token_seconds is None and pacer.prompt_tokens(decode_rows=8) == 32  # still unmeasured: the minimum


def test_estimates_follow_recent_iterations() -> None:
    pacer = PrefillPacer(max_tokens=4096, min_tokens=1)
    pacer.record(0.010, prompt_tokens=0, decode_rows=1)
    for _ in range(40):
        pacer.record(0.002, prompt_tokens=0, decode_rows=1)
    assert abs((pacer.decode_seconds or 0) - 0.002) < 1e-4


def test_a_new_decoding_load_is_learned_again() -> None:
    # Beside 64 streams' long decode steps prompt tokens looked expensive. Once 8 streams decode in 3 ms, chunks
    # paced from that fit are all the minimum: with one chunk size the samples never spread, the old fit stood
    # for good, and minimum-size chunks starved Poisson arrivals (TTFT of seconds on the H200).
    pacer = PrefillPacer(max_tokens=512, min_tokens=32)
    _simulate(pacer, decode=0.0105, fixed=0.0, per_token=0.0003, iterations=24)
    allowances = _simulate(pacer, decode=0.003, fixed=0.0003, per_token=0.000007, iterations=60)
    want = int(((STALL - 1) * 0.003 - 0.0003) / 0.000007)
    assert abs(allowances[-1] - want) <= 0.1 * want
    # On the way it grows by doubling at most (probes offer twice the paced count): never the whole budget at
    # once, which on a CPU is a gap of seconds for every stream.
    assert all(b <= 4 * a for a, b in zip(allowances, allowances[1:]))
    assert max(allowances) < 512 - 8


def test_on_a_cpu_the_smallest_chunk_keeps_a_mixed_iteration_within_the_stall() -> None:
    # The demo model on 2 cores: a decode step ~80 ms, a prompt token ~9 ms beside it. A 32-token floor made every
    # mixed iteration ~380 ms (4.8 decode steps against the 1.5 promised): running streams stalled whenever a
    # prompt arrived, for seconds at long contexts.
    from engine.accelerator import on_gpu
    from engine.pacing import minimum_chunk_default

    if on_gpu():
        pytest.skip("the CPU's floor")
    pacer = PrefillPacer(max_tokens=512, min_tokens=minimum_chunk_default())
    allowances = _simulate(pacer, decode=0.080, fixed=0.0, per_token=0.0093, iterations=24)
    assert all(0.080 + 0.0093 * n <= STALL * 0.080 + 1e-9 for n in allowances[-8:])


def test_a_fixed_cost_beyond_the_stall_buys_prompt_work_of_its_own_size_not_the_whole_budget() -> None:
    # A CPU: a fit over small, noisy chunks read a 107 ms fixed part beside 95 ms decode steps; the whole budget
    # (512 tokens at ~15 ms) then made one mixed iteration 6.8 s long.
    pacer = PrefillPacer(max_tokens=512, min_tokens=4)
    allowances = _simulate(pacer, decode=0.095, fixed=0.107, per_token=0.0156, iterations=32)
    assert pacer.fixed_seconds is not None and pacer.fixed_seconds >= 0.5 * 0.095
    assert max(allowances[-8:]) <= int(0.107 / 0.0156) + 1


def test_a_fit_made_on_a_noisy_stretch_is_made_again_from_chunks_of_one_size() -> None:
    # A 2-core CPU another process held: mixed iterations read as 131 ms a prompt token, every chunk became the
    # minimum, the samples (all of one size) never spread, and the fit stood for minutes (long prompts waited 2-4
    # minutes for a first token) although a token cost ~1 ms again.
    pacer = PrefillPacer(max_tokens=512, min_tokens=4)
    pacer.record(0.24, prompt_tokens=0, decode_rows=3)
    for n, extra in [(4, 0.30), (8, 0.9), (4, 0.5), (8, 1.2), (4, 0.6), (8, 1.1), (16, 2.0)]:
        pacer.record(0.24 + extra, n, 3)
    assert pacer.prompt_tokens(decode_rows=3) == 4
    allowances = _simulate(pacer, decode=0.24, fixed=0.0, per_token=0.001, iterations=80)
    want = int((STALL - 1) * 0.24 / 0.001)
    assert abs(allowances[-1] - want) <= 0.1 * want
    assert all(0.24 + 0.001 * n <= STALL * 0.24 + 1e-9 for n in allowances)  # never past the bound on the way
