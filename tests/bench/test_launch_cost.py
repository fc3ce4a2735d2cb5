"""bench/launch_cost.py: each chain is as long as asked and computes what its ops compute; main reports every kind
in both modes."""

from __future__ import annotations

import json

import mlx.core as mx

from bench.launch_cost import chains, main


def test_chains_apply_their_op_once_a_launch() -> None:
    x = mx.random.normal((1, 1, 128), key=mx.random.key(0)).astype(mx.bfloat16)
    fns = chains(128, 3)
    once = chains(128, 1)
    for kind in fns:
        want = x
        for _ in range(3):
            want = once[kind](want)
        assert mx.allclose(fns[kind](x).astype(mx.float32), want.astype(mx.float32)).item(), kind


def test_main_reports_each_kind_compiled_and_built(capsys) -> None:
    assert main(["--launches", "4", "--steps", "3", "--size", "128"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()[1:]]
    kinds = {r["kind"] for r in rows}
    assert {"rms_norm", "rope"} <= kinds
    assert {(r["kind"], r["mode"]) for r in rows} == {(k, m) for k in kinds for m in ("compiled", "built")}
    assert all(r["host_us_per_launch"] > 0 and r["wall_us_per_launch"] >= r["host_us_per_launch"] for r in rows)
