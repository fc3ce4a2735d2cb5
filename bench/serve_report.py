"""The serving benchmark's report: a markdown table of both servers side by side, and tandem/peer ratios."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown", "ratio_lines", "ratios", "mixed_lines"]


def _f(x: Any, digits: int = 0) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def _pair(d: dict[str, Any] | None, key: str, a: str = "p50", b: str = "p99") -> str:
    if not d:
        return "—"
    v = d.get(key) or {}
    digits = 1 if key == "itl_ms" else 0
    return f"{_f(v.get(a), digits)} / {_f(v.get(b), digits)}"


def _div(a: Any, b: Any) -> float | None:
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def ratios(ours: dict[str, Any] | None, peer: dict[str, Any] | None) -> dict[str, float | None]:
    """tandem/peer for one scenario's summaries (tok/s: higher is better; latencies, RSS: lower is better)."""
    if not ours or not peer:
        return {}
    out = {"tok_s": _div(ours.get("tok_s"), peer.get("tok_s"))}
    for key in ("ttft_ms", "itl_ms"):
        for p in ("p50", "p99"):
            out[f"{key[:-3]}_{p}"] = _div((ours.get(key) or {}).get(p), (peer.get(key) or {}).get(p))
    out["peak_rss"] = _div(ours.get("peak_rss_mb"), peer.get("peak_rss_mb"))
    return out


def _failed(s: dict[str, Any] | None) -> str:
    if not s:
        return "—"
    return f"{s['failed']}" + (f" ({', '.join(f'{k} {v}' for k, v in s['failed_reasons'].items())})" if s["failed"] else "")


def _load(result: dict[str, Any], when: str) -> str:
    value = (result.get("host") or {}).get(f"loadavg_at_{when}")
    return f"{value[0]:.1f}" if value else "—"


def markdown(result: dict[str, Any]) -> str:
    """The whole result as markdown (scenario table, warm-up, soak). Raises nothing for partial results."""
    servers = result.get("servers", {})
    ours, peer = servers.get("tandem") or {}, servers.get("peer") or {}
    o_sc, p_sc = ours.get("scenarios", {}), peer.get("scenarios", {})
    names = [n for n in result.get("scenario_order", []) if (n in o_sc or n in p_sc) and n not in ("soak", "mixed")]
    lines = [
        f"Model: `{result.get('model_dir')}` · profile `{result.get('profile')}` · {result.get('date')} · "
        f"load average at start/end {_load(result, 'start')} / {_load(result, 'end')}",
        "",
        "| scenario | tandem tok/s | peer tok/s | ratio | tandem TTFT p50/p99 ms | peer | tandem ITL p50/p99 ms | peer "
        "| failed tandem | failed peer | mean out tok t/p | tok/chunk t/p | peak RSS MB t/p |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in names:
        o, p = o_sc.get(n), p_sc.get(n)
        r = ratios(o, p)
        lines.append(
            f"| {n}: {result['scenarios'][n]} | {_f((o or {}).get('tok_s'))} | {_f((p or {}).get('tok_s'))} "
            f"| {_f(r.get('tok_s'), 2) + '×' if r.get('tok_s') else '—'} | {_pair(o, 'ttft_ms')} | {_pair(p, 'ttft_ms')} "
            f"| {_pair(o, 'itl_ms')} | {_pair(p, 'itl_ms')} | {_failed(o)} | {_failed(p)} "
            f"| {_f((o or {}).get('mean_output_tokens'))} / {_f((p or {}).get('mean_output_tokens'))} "
            f"| {_f((o or {}).get('tokens_per_chunk'), 2)} / {_f((p or {}).get('tokens_per_chunk'), 2)} "
            f"| {_f((o or {}).get('peak_rss_mb'))} / {_f((p or {}).get('peak_rss_mb'))} |"
        )
    lines += ["", "| server | ready after s | first round (warm-up, not timed above): streams, TTFT p50/p99/max ms, "
              "failed | idle RSS MB | peak RSS MB | exit |", "|---|---|---|---|---|---|"]
    for label, s in (("tandem", ours), ("peer", peer)):
        if not s:
            continue
        w = s.get("first_round") or {}
        t = w.get("ttft_ms") or {}
        first = (f"{w.get('requests', 0)}, {_f(t.get('p50'))} / {_f(t.get('p99'))} / {_f(t.get('max'))}, "
                 f"{w.get('failed', '—')}") if w else "—"
        lines.append(f"| {label} | {_f(s.get('ready_s'), 1)} | {first} | {_f(s.get('idle_rss_mb'))} "
                     f"| {_f(s.get('peak_rss_mb'))} | {s.get('exit_code')} |")
        if s.get("error"):
            lines.append(f"| {label} error | {s['error']} | | | | |")
    for label, s in (("tandem", ours), ("peer", peer)):
        soak = (s.get("scenarios") or {}).get("soak")
        if soak:
            r = soak.get("rss") or {}
            lines += ["", f"Soak ({label}): {result['scenarios']['soak']}: {soak['ok']} answered, {soak['disconnected']} "
                      f"disconnected on purpose, {_failed(soak)} failed, {_f(soak.get('tok_s'))} tok/s; RSS MB after "
                      f"{_f(r.get('ref_s'))} s {_f(r.get('ref_mb'))}, at the end {_f(r.get('end_mb'))} "
                      f"(end/ref {_f(r.get('end_over_ref'), 3)}), after {_f(r.get('settle_s'))} s idle "
                      f"{_f(r.get('settled_mb'))}, peak {_f(r.get('peak_mb'))}"]
    mixed = (ours.get("scenarios") or {}).get("mixed")
    if mixed and "mixed" in mixed:
        lines += ["", *mixed_lines(result["scenarios"]["mixed"], mixed)]
    return "\n".join(lines) + "\n"


def _counts(c: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (c or {}).items()) or "none"


def _note(text: str | None) -> str:
    return f" ({text})" if text else ""


def mixed_lines(description: str, summary: dict[str, Any]) -> list[str]:
    """The mixed soak (bench/serve_mixed.py) as markdown: served/refused per kind, errors, RSS, latency of
    admitted chat requests before vs during the burst. Raises nothing for partial summaries."""
    m, r = summary["mixed"], summary.get("rss") or {}
    lines = [f"Mixed soak (tandem): {description}; burst of {m['burst']['size']} at {m['burst']['at_s']} s "
             f"(lasted {m['burst']['lasted_s']} s).", "",
             "| kind | sent | served | disconnected on purpose | refused 429 | failed otherwise |", "|---|---|---|---|---|---|"]
    for kind, row in m["by_kind"].items():
        lines.append(f"| {kind} | {row['sent']} | {row['served']} | {row['disconnected']} | {row['refused_429']} "
                     f"| {row['failed']} |")
    errors = ", ".join(f"{k} {v}" for k, v in m["errors_by_kind"].items()) or "none"
    kill = m.get("kill") or {}
    if kill.get("at_s") is not None or kill.get("error"):
        lines += ["", f"Engine process killed at {_f(kill.get('at_s'), 1)} s{_note(kill.get('error'))}; /health 200 "
                  f"again after {_f(kill.get('healthy_after_s'), 1)} s. Errors of requests in flight at the kill: "
                  f"{_counts(kill.get('in_flight_errors'))}; of requests sent while it restarted: "
                  f"{_counts(kill.get('restart_errors'))}."]
    if (live := m.get("live_session_s")) and live.get("n"):
        lines += ["", f"Live sessions served: {live['n']}, each start to last transcript p50 {_f(live.get('p50'), 1)} s, "
                  f"max {_f(live.get('max'), 1)} s."]
    lines += ["", f"Errors by kind: {errors} (unexpected, i.e. not 429 nor at the engine kill: {m['unexpected_errors']}). RSS MB at the "
              f"start {_f(r.get('start_mb'))}, after {_f(r.get('ref_s'))} s {_f(r.get('ref_mb'))}, at the end "
              f"{_f(r.get('end_mb'))}, after {_f(r.get('settle_s'))} s idle {_f(r.get('settled_mb'))}, peak "
              f"{_f(r.get('peak_mb'))}.", "",
              "| admitted chat requests | n | end-to-end p50 / p99 ms | TTFT p50 / p99 ms |", "|---|---|---|---|"]
    for label, key in (("started before the burst", "admitted_chat_before_burst"),
                       ("started during the burst", "admitted_chat_during_burst")):
        row = m[key]
        lines.append(f"| {label} | {row['n']} | {_pair(row, 'e2e_ms')} | {_pair(row, 'ttft_ms')} |")
    itl = m.get("itl_ms") or {}
    b, d = itl.get("before_burst") or {}, itl.get("during_burst") or {}
    lines += ["", f"Inter-token latency of running streams (per token, p50 / p99 ms): before the burst "
              f"{_f(b.get('p50'), 1)} / {_f(b.get('p99'), 1)} ({b.get('n', 0)} tokens), during it "
              f"{_f(d.get('p50'), 1)} / {_f(d.get('p99'), 1)} ({d.get('n', 0)} tokens)."]
    return lines


def ratio_lines(result: dict[str, Any]) -> list[str]:
    """One 'tandem/peer' line per scenario both servers ran. Raises nothing."""
    servers = result.get("servers", {})
    o_sc = (servers.get("tandem") or {}).get("scenarios", {})
    p_sc = (servers.get("peer") or {}).get("scenarios", {})
    out = []
    for n in result.get("scenario_order", []):
        r = ratios(o_sc.get(n), p_sc.get(n))
        if r:
            body = ", ".join(f"{k} {v:.2f}×" if v is not None else f"{k} —" for k, v in r.items())
            out.append(f"{n} tandem/peer: {body}; failed {o_sc[n]['failed']}/{p_sc[n]['failed']}")
    return out
