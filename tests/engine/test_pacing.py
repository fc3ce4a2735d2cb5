"""PrefillPacer: prompt chunks beside decoding rows are paced so a mixed iteration lasts at most STALL
decode iterations; with nothing measured, or nothing decoding, prompts get the whole budget."""

from __future__ import annotations

from engine.pacing import STALL, PrefillPacer


def test_unmeasured_or_idle_uses_the_whole_budget() -> None:
    pacer = PrefillPacer(max_tokens=512, min_tokens=32)
    assert pacer.prompt_tokens(decode_rows=8) == 504
    pacer.record(0.004, prompt_tokens=0, decode_rows=8)
    pacer.record(0.020, prompt_tokens=256, decode_rows=8)
    assert pacer.prompt_tokens(decode_rows=0) == 512


def test_prompt_tokens_keep_a_mixed_iteration_within_the_stall() -> None:
    pacer = PrefillPacer(max_tokens=512, min_tokens=32)
    pacer.record(0.004, prompt_tokens=0, decode_rows=8)  # decode-only: 4 ms
    pacer.record(0.004 + 256 * 0.0001, prompt_tokens=256, decode_rows=8)  # each prompt token adds 0.1 ms
    allowed = pacer.prompt_tokens(decode_rows=8)
    assert allowed == int((STALL - 1) * 0.004 / 0.0001)
    assert 0.004 + allowed * 0.0001 <= STALL * 0.004 + 1e-9


def test_the_allowance_stays_between_the_minimum_and_the_budget() -> None:
    slow = PrefillPacer(max_tokens=512, min_tokens=32)
    slow.record(0.001, prompt_tokens=0, decode_rows=4)
    slow.record(1.0, prompt_tokens=100, decode_rows=4)  # a CPU: prompt tokens are expensive
    assert slow.prompt_tokens(decode_rows=4) == 32
    fast = PrefillPacer(max_tokens=512, min_tokens=32)
    fast.record(0.010, prompt_tokens=0, decode_rows=4)
    fast.record(0.0101, prompt_tokens=100, decode_rows=4)
    assert fast.prompt_tokens(decode_rows=4) == 508


def test_prompt_only_iterations_do_not_count_their_fixed_cost_per_token() -> None:
    pacer = PrefillPacer(max_tokens=512, min_tokens=32)
    pacer.record(0.004, prompt_tokens=0, decode_rows=8)
    pacer.record(0.050, prompt_tokens=20, decode_rows=0)  # mostly the weights read once, not 2.5 ms a token
    assert pacer.token_seconds is None and pacer.prompt_tokens(decode_rows=8) == 504


def test_estimates_follow_recent_iterations() -> None:
    pacer = PrefillPacer(max_tokens=4096, min_tokens=1)
    pacer.record(0.010, prompt_tokens=0, decode_rows=1)
    for _ in range(40):
        pacer.record(0.002, prompt_tokens=0, decode_rows=1)
    assert abs((pacer.decode_seconds or 0) - 0.002) < 1e-4
