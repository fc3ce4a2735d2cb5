"""Serving benchmark over HTTP: `tandem serve` vs `mlx_lm.server`, same model dir, same load, one at a time.

For each server: start it, wait for /health, one warm-up burst (reported as "first round", since MLX on
CUDA compiles every new shape), then the scenarios (bench/serve_scenarios.py) through a real streaming
httpx client, then stop it. Prints a markdown table with both servers and tandem/peer ratios; --out
writes every figure as JSON (rewritten after each scenario, so a killed run keeps what it measured).

    python3 -m bench.serve --model DIR --scenarios c1,c8 --profile cpu --out serve.json
    tandem benchmark serve --model DIR --ours-args "--max-active 128 --no-whisper"

Output length: neither server is asked to ignore EOS (mlx_lm.server has no such field); prompts ask for
long stories and the mean output tokens per request is reported for both, so a server that stops early
shows. How ITL is counted when a chunk carries several tokens: see bench/serve_stats.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import anyio

try:
    from engine.backend import ensure_fast_blas
except ImportError:  # a bare client host: no engine, the peer keeps its own BLAS
    pass
else:
    # A script entry point: the fast BLAS is loaded before anything imports MLX (the demo model's conversion does),
    # and the peer is given the same one (`_peer_env`); chosen after, it fell back to MLX's reference BLAS and the
    # CPU peer ran ~10x slower than it does.
    ensure_fast_blas()

from bench.serve_client import chat_body, make_client, responses_body, stream_chat
from bench.serve_mixed import drive_mixed, summarize_mixed
from bench.serve_procs import Server, exit_on_sigterm
from bench.serve_prompts import PromptMaker
from bench.serve_report import markdown, ratio_lines
from bench.serve_scenarios import DEFAULT_SET, PROFILES, SCENARIOS, Request, Scenario, run_scenario, scenarios_for
from bench.serve_stats import RequestResult, summarize

__all__ = ["main", "cli", "OURS_CMD", "PEER_CMD"]

OURS_CMD = "{python} -m service.cli serve {model} --host 127.0.0.1 --port {port} {args}"
PEER_CMD = "{python} -m mlx_lm.server --model {model} --host 127.0.0.1 --port {port} {args}"
_MB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _now() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S")


def _log(msg: str) -> None:
    print(f"[{_now()}] {msg}", file=sys.stderr, flush=True)


def _peer_env() -> dict[str, str]:
    """The peer runs on the BLAS our engine chose, GEMV shim included (LD_PRELOAD), so the CPU comparison is like
    for like."""
    env = dict(os.environ)
    if os.environ.get("TANDEM_BLAS", "").strip() == "reference" or sys.platform != "linux":
        return env
    try:
        from engine.backend import blas_info

        info = blas_info()
    except Exception:  # no engine here (a bare client host): the peer keeps its own BLAS
        return env
    if (preload := info.preload()):
        env["LD_PRELOAD"] = preload
    return env


def _run_async(fn: Any, *args: Any) -> Any:
    # uvloop (in the H200 image) keeps the client's own per-chunk cost low at 100+ streams.
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return anyio.run(fn, *args)
    return anyio.run(fn, *args, backend_options={"use_uvloop": True})


class Bench:
    """One benchmark run's settings and the prompts shared by both servers."""

    def __init__(self, a: argparse.Namespace, model_dir: str) -> None:
        self.a = a
        self.model_dir = model_dir
        self.maker = PromptMaker(a.tokenizer or model_dir, seed=a.seed)

    def body(self, req: Request, tag: str) -> dict[str, Any]:
        system, user = self.maker.make(req.index, req.prompt_tokens, tag)
        # BENCH_BODY_EXTRA: JSON fields added to every chat request (e.g. {"logprobs":true}), to price a feature.
        make = responses_body if self.a.api == "responses" else chat_body
        return {**make(system, user, req.max_tokens, self.a.model_name),
                **json.loads(os.environ.get("BENCH_BODY_EXTRA") or "{}")}

    async def scenario(self, base: str, s: Scenario, deadline: float) -> tuple[list[RequestResult], float]:
        url = base + ("/v1/responses" if self.a.api == "responses" else "/v1/chat/completions")
        bodies: dict[int, dict[str, Any]] = {}
        async with make_client() as client:

            async def send(req: Request, timeout: float) -> RequestResult:
                body = bodies.get(req.index) or self.body(req, s.name)
                return await stream_chat(client, url, body, timeout, req.disconnect_after, self.a.retries)

            def prepare(req: Request) -> None:  # prompts built before the clock starts
                bodies[req.index] = self.body(req, s.name)

            return await run_scenario(s, send, self.a.timeout, deadline, self.a.seed, prepare)

    def measure_mixed(self, s: Scenario, server: Server, deadline: float) -> dict[str, Any]:
        """The mixed soak against a server that reports its limits (ours); skipped for others."""
        limits = (_server_stats(server.base_url, raw=True) or {}).get("limits") or {}
        burst = self.a.burst if self.a.burst is not None else 3 * int(limits.get("max_queued") or 0)
        if not burst:
            return {"skipped": "no --max-queued reported (a server without admission control)"}
        run = _run_async(drive_mixed, server.base_url, s, burst, deadline, self.a, lambda r: self.body(r, s.name),
                         server.proc.pid if server.proc is not None else None)
        t_end = time.perf_counter()
        chat = [r for kind, r in run.records if kind in ("chat", "burst")]
        for r in chat:
            r.count_tokens(self.maker.tokens_of)
        summary = summarize(chat, max((r.t_end for r in chat), default=run.t0) - run.t0)
        summary["mixed"] = summarize_mixed(run)
        inside = [b for t, b in server.samples if run.t0 <= t <= t_end]
        summary["rss"] = {**self._soak_rss(server, run.t0, t_end), "start_mb": round(inside[0] / _MB, 1) if inside else None}
        summary["peak_rss_mb"] = round(max(inside, default=0) / _MB, 1)
        return summary

    def measure(self, s: Scenario, server: Server, deadline: float) -> dict[str, Any]:
        if s.kind == "mixed":
            return self.measure_mixed(s, server, deadline)
        results, wall = _run_async(self.scenario, server.base_url, s, deadline)
        t_end = time.perf_counter()
        for r in results:
            r.count_tokens(self.maker.tokens_of)
        summary = summarize(results, wall)
        t_start = min((r.t_start for r in results), default=t_end)
        summary["peak_rss_mb"] = round(server.rss_between(t_start, t_end) / _MB, 1)
        if s.kind == "soak":
            summary["rss"] = self._soak_rss(server, t_start, t_end)
        return summary

    def _soak_rss(self, server: Server, t0: float, t1: float) -> dict[str, Any]:
        """RSS after the first minute (or half the soak, if shorter) vs at the end, then after idling."""
        ref_s = min(60.0, (t1 - t0) / 2)
        inside = [(t - t0, b) for t, b in server.samples if t0 <= t <= t1]
        ref = min(inside, key=lambda x: abs(x[0] - ref_s), default=(0.0, 0))
        end = inside[-1] if inside else (0.0, 0)
        time.sleep(self.a.soak_settle)  # measure what stays once the load is gone
        settled = server.rss_now()
        every_s = [round(b / _MB, 1) for i, (t, b) in enumerate(inside) if i == 0 or int(t) != int(inside[i - 1][0])]
        return {"ref_s": round(ref[0], 1), "ref_mb": round(ref[1] / _MB, 1), "end_mb": round(end[1] / _MB, 1),
                "end_over_ref": round(end[1] / ref[1], 3) if ref[1] else None, "settle_s": self.a.soak_settle,
                "settled_mb": round(settled / _MB, 1), "peak_mb": round(max((b for _, b in inside), default=0) / _MB, 1),
                "per_second_mb": every_s}

    def warmup(self, server: Server, streams: int, deadline: float) -> dict[str, Any]:
        s = Scenario("warmup", "closed", requests=streams, concurrency=streams, max_tokens=(16, 16))
        return self.measure(s, server, min(deadline, time.perf_counter() + self.a.timeout))


def _argv(template: str, model: str, port: int, extra: str) -> list[str]:
    return shlex.split(template.format(python=shlex.quote(sys.executable), model=shlex.quote(model), port=port,
                                       args=extra))


def run_server(bench: Bench, name: str, argv: list[str], port: int, env: dict[str, str],
               scenarios: list[Scenario], result: dict[str, Any], save: Any) -> None:
    """Start one server, warm it, run every scenario within its budget, stop it; results into `result`."""
    a = bench.a
    log_dir = Path(a.log_dir)
    server = Server(name, argv, f"http://127.0.0.1:{port}", log_dir / f"{name}.log", env)
    entry: dict[str, Any] = {"command": shlex.join(argv), "log": str(server.log_path), "scenarios": {}}
    result["servers"][name] = entry
    t_begin = time.perf_counter()
    deadline = t_begin + a.server_budget if a.server_budget else float("inf")
    _log(f"{name}: starting: {entry['command']}")
    try:
        server.start()
        entry["ready_s"] = round(server.wait_ready(a.ready_path, min(a.ready_timeout, deadline - time.perf_counter())), 2)
        entry["idle_rss_mb"] = round(server.rss_now() / _MB, 1)
        _log(f"{name}: ready after {entry['ready_s']} s, RSS {entry['idle_rss_mb']} MB")
        closed = [s.concurrency for s in scenarios if s.kind != "poisson"]
        streams = a.warmup_streams if a.warmup_streams is not None else max(closed + [8], default=8)
        if streams > 0:
            entry["first_round"] = bench.warmup(server, streams, deadline)
            _log(f"{name}: first round ({streams} streams): TTFT ms {entry['first_round']['ttft_ms']}, "
                 f"failed {entry['first_round']['failed']}")
        save()
        for s in scenarios:
            if not server.alive():
                entry["scenarios"][s.name] = {"skipped": "server exited"}
                continue
            if time.perf_counter() >= deadline:
                entry["scenarios"][s.name] = {"skipped": "server budget spent"}
                continue
            summary = bench.measure(s, server, deadline)
            if (stats := _server_stats(server.base_url)) is not None:
                summary["server_stats"] = stats  # ours: cumulative engine counters (step / publish / loop gap)
            entry["scenarios"][s.name] = summary
            _log(f"{name} {s.name}: {summary['tok_s']} tok/s, TTFT ms {summary['ttft_ms']}, ITL ms {summary['itl_ms']}, "
                 f"failed {summary['failed']}, mean out {summary['mean_output_tokens']}")
            save()
    except Exception as exc:  # a server that cannot start or dies: recorded, the other server still runs
        entry["error"] = f"{type(exc).__name__}: {exc}"
        _log(f"{name}: {entry['error']}")
    except BaseException as exc:  # SIGTERM (SystemExit) or Ctrl-C: recorded, then the run ends
        entry["error"] = f"interrupted ({type(exc).__name__})"
        raise
    finally:
        entry["alive_at_end"] = server.alive()
        entry["exit_code"] = server.stop()
        entry["peak_rss_mb"] = round(max((b for _, b in server.samples), default=0) / _MB, 1)
        entry["seconds"] = round(time.perf_counter() - t_begin, 1)
        save()
        _log(f"{name}: stopped (exit {entry['exit_code']}), peak RSS {entry['peak_rss_mb']} MB")


def _server_stats(base: str, raw: bool = False) -> dict[str, Any] | None:
    """Ours' /stats engine counters after a scenario (`raw`: the whole document; None for a server without
    /stats). Raises nothing."""
    import httpx

    try:
        r = httpx.get(f"{base}/stats", timeout=5)
        data = r.json() if r.status_code == 200 else None
    except Exception:  # the peer has no /stats; a failing one must not end the run
        return None
    if not isinstance(data, dict) or raw:
        return data if isinstance(data, dict) else None
    engine = data.get("engine", data)
    keys = ("iterations", "mixed_iterations", "generation_tokens", "prompt_tokens", "step_seconds", "publish_seconds",
            "loop_gap_seconds", "failed_steps", "engine_busy_seconds", "memory", "pacing", "iteration_times",
            "compiled_decode", "prefill_lane")
    return {**{k: engine.get(k) for k in keys if k in engine}, "gc": data.get("gc")}


def main(a: argparse.Namespace) -> int:
    """Run the benchmark described by parsed options. Returns the exit code (1 when a server failed)."""
    model_dir = a.model
    if model_dir is None:
        from engine.models import hf_dir_for  # the embedded demo, converted (float32 on CPU)

        model_dir = str(hf_dir_for(None))
    if a.smoke:
        from bench.serve_smoke import smoke

        return smoke(a, model_dir)
    names = [n.strip() for n in a.scenarios.split(",") if n.strip()]
    requests = {k: int(v) for k, v in (kv.split("=") for kv in a.requests.split(",") if kv)} if a.requests else {}
    scenarios = scenarios_for(names, a.profile, requests, a.max_tokens, a.prompt_tokens, a.soak_minutes,
                              a.soak_streams, _span(a.soak_prompts))
    bench = Bench(a, model_dir)
    result: dict[str, Any] = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "node": platform.node(), "loadavg_at_start": os.getloadavg()},
        "model_dir": model_dir,
        "model_config": _model_config(model_dir),
        "profile": a.profile,
        "argv": sys.argv,
        "prompts": bench.maker.describe(),
        "timeout_s": a.timeout,
        "retries": a.retries,
        "scenario_order": [s.name for s in scenarios],
        "scenarios": {s.name: s.describe() for s in scenarios},
        "servers": {},
    }
    if not bench.maker.calibrated:
        _log(f"no tokenizer.json in {a.tokenizer or model_dir}: prompt lengths and chunk tokens are estimates")

    def save() -> None:
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1))

    plan = [("tandem", a.ours_cmd, a.ours_args, dict(os.environ)), ("peer", a.peer_cmd, a.peer_args, _peer_env())]
    try:
        for name, template, extra, env in plan:
            if a.only and a.only != {"tandem": "ours"}.get(name, name):
                continue
            port = _free_port()
            run_server(bench, name, _argv(template, model_dir, port, extra), port, env, scenarios, result, save)
    finally:  # also when interrupted: the table of what was measured
        result["host"]["loadavg_at_end"] = os.getloadavg()
        md = markdown(result)
        print(md)
        if a.ratios:
            print("\n".join(ratio_lines(result)))
        if a.markdown:
            Path(a.markdown).write_text(md + "\n" + "\n".join(ratio_lines(result)) + "\n")
        save()
    return 1 if any(s.get("error") for s in result["servers"].values()) else 0


def _span(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def _model_config(model_dir: str) -> dict[str, Any]:
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "rope_scaling", "torch_dtype", "quantization")
    return {k: cfg[k] for k in keys if k in cfg}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem benchmark serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="scenarios: " + "; ".join(f"{n}: {s.describe()}" for n, s in SCENARIOS.items()))
    p.add_argument("--model", default=None, help="HF-layout model dir for both servers (default: the demo, converted)")
    p.add_argument("--tokenizer", default=None, help="dir with tokenizer.json for prompt lengths (default: --model)")
    p.add_argument("--model-name", default=None, help="`model` field of the requests (default: omitted, the loaded one)")
    p.add_argument("--api", default=os.environ.get("BENCH_API", "chat"), choices=["chat", "responses"],
                   help="what the scenarios call: /v1/chat/completions or /v1/responses (the peer has no responses: "
                        "use --only ours; $BENCH_API sets it in bench/gpu/ab_h200.sh's VARIANTS) (default chat)")
    p.add_argument("--scenarios", default=",".join(DEFAULT_SET), help=f"comma list of {', '.join(SCENARIOS)}")
    p.add_argument("--profile", default="full", choices=sorted(PROFILES), help="request counts (quick: H200 call)")
    p.add_argument("--requests", default="", help="per-scenario request counts, e.g. c1=4,c8=16")
    p.add_argument("--max-tokens", type=int, default=None, help="override the scenarios' fixed max_tokens (128)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="override the scenarios' fixed prompt length (128)")
    p.add_argument("--soak-minutes", type=float, default=None)
    p.add_argument("--soak-streams", type=int, default=None, help="soak concurrency (default 16)")
    p.add_argument("--soak-prompts", default=None,
                   help="soak prompt lengths in tokens as LO-HI (default 128-2048; lower on a slow CPU)")
    p.add_argument("--soak-settle", type=float, default=5.0, help="idle seconds before the soak's last RSS reading")
    p.add_argument("--burst", type=int, default=None, help="mixed: burst size (default: 3 x the server's --max-queued)")
    p.add_argument("--audio", default=None, help="mixed: the file each transcription uploads (default: the first WAV "
                                                 "of $TANDEM_AUDIO_SAMPLES, else 5 s of synthetic voice)")
    p.add_argument("--live-seconds", type=float, default=20.0,
                   help="mixed: audio per live session (the samples' clips joined with pauses)")
    p.add_argument("--kill-engine-at", type=float, default=None,
                   help="mixed: SIGKILL the --isolate engine process once, at this fraction of the soak (e.g. 0.7)")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request seconds; past it the request failed")
    p.add_argument("--retries", type=int, default=0,
                   help="resend after a transport error before any response header (OpenAI's SDK does 2); default 0")
    p.add_argument("--server-budget", type=float, default=None,
                   help="seconds per server (start to last scenario); later requests are not sent")
    p.add_argument("--warmup-streams", type=int, default=None, help="first-round burst size (default: largest concurrency)")
    p.add_argument("--ready-path", default="/health")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--ours-cmd", default=OURS_CMD, help="template: {python} {model} {port} {args}")
    p.add_argument("--ours-args", default="--no-whisper", help="extra arguments for ours, e.g. '--max-active 128'")
    p.add_argument("--peer-cmd", default=PEER_CMD, help="template: {python} {model} {port} {args}")
    p.add_argument("--peer-args", default="")
    p.add_argument("--only", choices=["ours", "peer"], default=None)
    p.add_argument("--smoke", action="store_true", help="only start ours and check one streamed + one plain reply")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON result file")
    p.add_argument("--markdown", default=None, help="also write the markdown table here")
    p.add_argument("--log-dir", default="bench-logs", help="server logs (ours: tandem.log, peer.log)")
    p.add_argument("--ratios", action="store_true", help="print one 'tandem/peer' line per scenario")
    return p


def cli(argv: list[str] | None = None) -> int:
    """`tandem benchmark serve` / `python3 -m bench.serve`. Raises SystemExit on bad options or SIGTERM."""
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    p = parser()
    a = p.parse_args(argv)
    bad = [n for n in a.scenarios.split(",") if n.strip() and n.strip() not in SCENARIOS]
    if bad:
        p.error(f"unknown scenario(s) {', '.join(bad)}; known: {', '.join(SCENARIOS)}")
    return main(a)


if __name__ == "__main__":
    sys.exit(cli())
