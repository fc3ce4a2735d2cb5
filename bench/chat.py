"""Chat benchmark: mlx-tandem vs mlx-lm's own generate loop and vs mlx_lm.server, same model, same run.

Measures one stream's decode tokens/s over HTTP against `mlx_lm.stream_generate` in-process, then
TTFT / ITL / aggregate tokens/s at 1, 4 and 8 concurrent streams against both servers in turn.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio

from bench.load import run_load, wait_ready

__all__ = ["main", "cli", "make_prompts", "stream_levels"]

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven curious children watch from the old "
    "stone bridge and talk about rivers mountains clouds trains music bread gardens and stars"
).split()


def make_prompts(n: int, words: int = 64) -> list[str]:
    """n distinct prompts of `words` words each (distinct starts so no server reuses another's prefix)."""
    out = []
    for i in range(n):
        body = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words - 6))
        out.append(f"Request {i}: please continue this story. {body}")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _blas_env() -> dict[str, str]:
    """Give the peer the same BLAS we run on (LD_PRELOAD of what engine.backend chose, GEMV shim included)."""
    from engine.backend import blas_info

    env = dict(os.environ)
    info = blas_info()
    if (preload := info.preload()) and sys.platform == "linux":
        env["LD_PRELOAD"] = preload
    return env


def peer_generate_tps(model_dir: str, prompt: str, max_tokens: int) -> dict:
    """mlx-lm's own single-stream generate loop, in a subprocess with the same BLAS."""
    code = f"""
import json, mlx_lm
from mlx_lm.sample_utils import make_sampler
model, tok = mlx_lm.load({model_dir!r})
msgs = [{{"role": "user", "content": {prompt!r}}}]
p = tok.apply_chat_template(msgs, add_generation_prompt=True)
for _ in range(2):
    last = None
    for r in mlx_lm.stream_generate(model, tok, p, max_tokens={max_tokens}, sampler=make_sampler(0.0)):
        last = r
print(json.dumps({{"generation_tps": last.generation_tps, "prompt_tps": last.prompt_tps, "tokens": last.generation_tokens}}))
"""
    out = subprocess.run([sys.executable, "-c", code], env=_blas_env(), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _serve(cmd: list[str], port: int, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
    except Exception:
        proc.kill()
        raise RuntimeError(f"{cmd[:3]} failed to start: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
    return proc


def measure_server(name: str, cmd: list[str], port: int, model: str, levels: list[int], max_tokens: int) -> list[dict]:
    proc = _serve(cmd, port, _blas_env())
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        # Warm-up: first shapes compile/allocate; steady state is what we report.
        anyio.run(run_load, base, model, make_prompts(2), 8)
        for n in levels:
            res = anyio.run(run_load, base, model, make_prompts(n), max_tokens)
            row = {"server": name, **res.summary()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rows


def main(model_spec: str | None = None, levels: tuple[int, ...] = (1, 4, 8), max_tokens: int = 64,
         out: str | None = None, peer: bool = True) -> dict:
    """Run the whole comparison; print a table and return (and optionally write) the JSON result."""
    from engine.backend import ensure_fast_blas

    ensure_fast_blas()  # before hf_dir_for imports MLX: else both sides fall back to MLX's reference BLAS
    from engine.models import hf_dir_for

    model_dir = str(hf_dir_for(model_spec))
    model_name = Path(model_dir).name
    result: dict = {"model_dir": model_dir, "levels": list(levels), "max_tokens": max_tokens}
    prompt = make_prompts(1)[0]

    result["mlx_lm_generate"] = peer_generate_tps(model_dir, prompt, max_tokens) if peer else None
    print("mlx_lm.stream_generate:", result["mlx_lm_generate"], flush=True)

    port = _free_port()
    tandem_cmd = [sys.executable, "-m", "service.cli", "serve", model_dir, "--port", str(port), "--no-whisper"]
    result["tandem"] = measure_server("mlx-tandem", tandem_cmd, port, model_name, list(levels), max_tokens)
    if peer:
        port = _free_port()
        peer_cmd = [sys.executable, "-m", "mlx_lm.server", "--model", model_dir, "--port", str(port)]
        result["mlx_lm_server"] = measure_server("mlx_lm.server", peer_cmd, port, model_dir, list(levels), max_tokens)

    _report(result)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2))
    return result


def _report(r: dict) -> None:
    t = {row["concurrency"]: row for row in r["tandem"]}
    p = {row["concurrency"]: row for row in r.get("mlx_lm_server") or []}
    gen = r.get("mlx_lm_generate")
    print("\n== mlx-tandem vs peers (same machine, same run)")
    if gen and 1 in t:
        ours = t[1]["per_stream_decode_tok_s"]
        print(f"one stream decode: tandem {ours:.2f} tok/s vs mlx_lm.stream_generate {gen['generation_tps']:.2f} tok/s "
              f"→ per-token overhead {(gen['generation_tps'] / max(ours, 1e-9) - 1) * 100:+.1f}%")
    if 1 in t and max(t) > 1:
        top = max(t)
        print(f"aggregate at {top} streams / one stream: {t[top]['aggregate_tok_s'] / max(t[1]['aggregate_tok_s'], 1e-9):.2f}×")
    print(f"{'streams':>7} {'server':>14} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'agg tok/s':>9}")
    for n in sorted(t):
        for row in filter(None, (t.get(n), p.get(n))):
            print(f"{n:>7} {row['server']:>14} {row['ttft_p50_s']:>9} {row['ttft_p99_s']:>9} {row['itl_p50_ms']:>8} "
                  f"{row['itl_p99_ms']:>8} {row['aggregate_tok_s']:>9}")
        if n in p:
            print(f"{'':>7} {'ratio':>14} {t[n]['ttft_p99_s'] / max(p[n]['ttft_p99_s'], 1e-9):>19.2f}× TTFT p99, "
                  f"{t[n]['aggregate_tok_s'] / max(p[n]['aggregate_tok_s'], 1e-9):.2f}× aggregate")


def stream_levels(text: str) -> tuple[int, ...]:
    """'1,4,8' → (1, 4, 8): concurrent streams, each a positive integer. Raises argparse.ArgumentTypeError."""
    import argparse

    from service.cli.parsers import positive_int

    try:
        return tuple(positive_int(part.strip()) for part in text.split(","))
    except argparse.ArgumentTypeError:  # 0 streams measured nothing, then crashed
        raise argparse.ArgumentTypeError(f"not a list of positive integers: {text!r} (use e.g. 1,4,8)") from None


def cli(argv: list[str] | None = None) -> int:
    """`tandem benchmark chat`: parse options, run main(). Raises SystemExit(2) on bad options, ModelNotFound
    for an unknown model (`tandem benchmark` reports it as one line)."""
    import argparse

    from service.cli.parsers import positive_int

    p = argparse.ArgumentParser(prog="tandem benchmark chat", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model spec (default: the embedded demo)")
    p.add_argument("--levels", type=stream_levels, default=(1, 4, 8), metavar="N,N,...",
                   help="concurrent streams to measure (default: 1,4,8)")
    p.add_argument("--max-tokens", type=positive_int, default=64)
    p.add_argument("--no-peer", action="store_true", help="skip mlx-lm and mlx_lm.server")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    a = p.parse_args(argv)
    from bench.serve_procs import exit_on_sigterm

    # A SIGTERM to this process alone unwinds through measure_server's `finally`: its server stops too (it was left
    # running, an orphan holding the model's memory).
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    main(a.model, a.levels, a.max_tokens, a.out, not a.no_peer)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
