"""Prometheus metrics (prometheus-client), one registry per app.

Observed by the service as requests run: requests (and websocket sessions) by route and status, end-to-end duration, time to
first token, inter-token latency, time a request waited before it reached the engine, Whisper audio seconds
and real-time factor; the usage requests were answered with, and streams that failed after their headers (whose
status, counted in tandem_requests_total, was 200) by their error's code. Read from the engine at scrape time:
active/queued rows, KV, prefix-cache and memory-budget bytes (gauges), and the engine's own running totals (counters).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.process.gc_pauses import GC_PAUSES

if TYPE_CHECKING:
    from service.state import AppState

__all__ = ["ServiceMetrics", "CONTENT_TYPE"]

# Litestar adds "; charset=utf-8" to a text/* type itself (written here too, it came twice).
CONTENT_TYPE = "text/plain; version=0.0.4"

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TOKEN_GAP = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_SESSION = (1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600)
_RTF = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8)

# engine.stats() keys that only grow: exported as counters (prometheus-client appends `_total`).
_ENGINE_TOTALS = {
    "iterations": "Scheduler iterations run",
    "mixed_iterations": "Iterations that decoded and prefilled together",
    "prompt_tokens": "Prompt tokens prefilled",
    "generation_tokens": "Tokens generated",
    "finished_rows": "Generations finished",
    "cancelled_rows": "Generations cancelled",
    "failed_steps": "Engine steps that failed",
}
_ENGINE_GAUGES = {
    "active_rows": "Generations running now",
    "queued_rows": "Generations waiting for a slot",
    "kv_bytes": "Bytes of KV held by running generations",
}
_PREFIX_TOTALS = {"hits": "Prefix-cache lookups that hit", "misses": "Prefix-cache lookups that missed",
                  "hit_tokens": "Prompt tokens served from the prefix cache", "evictions": "Prefix-cache evictions",
                  "promotions": "Prefix-cache entries a hit moved out of probation"}


class ServiceMetrics:
    """The app's metrics; `render()` is the /metrics body."""

    def __init__(self, state: "AppState") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("tandem_requests", "HTTP requests answered, by route, method and status",
                                ["route", "method", "status"], registry=r)
        # Once per request answered 200, as it ends (a stream failed or left after its headers too: what it had counted
        # then); error statuses gave no usage. The sum is what clients were billed, where the engine's prompt_tokens
        # counts what it prefilled (prefix-cache hits left out).
        self.usage_prompt = Counter("tandem_usage_prompt_tokens", "Prompt tokens of the usage requests were answered "
                                    "with, cached ones included, by route", ["route"], registry=r)
        self.usage_completion = Counter("tandem_usage_completion_tokens", "Completion tokens of the usage requests "
                                        "were answered with, by route", ["route"], registry=r)
        self.usage_cached = Counter("tandem_usage_cached_tokens", "Prompt tokens of that usage served from the prefix "
                                    "cache (cached_tokens), by route", ["route"], registry=r)
        # A stream's status is its headers' 200: how many of those failed, and why (codes: the server's, a fixed set).
        self.stream_failures = Counter("tandem_stream_failures", "Streams that failed after their headers went out, by "
                                       "route and error code", ["route", "code"], registry=r)
        self.duration = Histogram("tandem_request_duration_seconds",
                                  "Arrival to last byte of the response, by route", ["route"],
                                  buckets=_LATENCY, registry=r)
        self.ttft = Histogram("tandem_time_to_first_token_seconds",
                              "Arrival of a generation request to its first token", buckets=_LATENCY, registry=r)
        self.itl = Histogram("tandem_inter_token_latency_seconds",
                             "Gap between successive token deliveries of a stream", buckets=_TOKEN_GAP, registry=r)
        # Before the engine: the tokenizer's turn and rendering. The wait for a running slot inside the
        # engine shows in TTFT (the engine does not report admission times).
        self.queue_wait = Histogram("tandem_queue_wait_seconds",
                                    "Arrival to submission to the engine (waiting for the tokenizer and rendering)",
                                    buckets=_LATENCY, registry=r)
        # Websocket sessions (live transcription) are counted here too, once each as it ends: method "WS", status
        # 101 (accepted) or 403 (refused at the handshake); their length goes to the session histogram instead.
        self.sessions = Histogram("tandem_session_duration_seconds", "Websocket session length, by route", ["route"],
                                  buckets=_SESSION, registry=r)
        self.audio_seconds = Counter("tandem_whisper_audio_seconds",
                                     "Seconds of audio received for transcription: files and live sessions",
                                     registry=r)
        self.real_time_factor = Histogram("tandem_whisper_real_time_factor",
                                          "Transcription wall time over audio duration, per file",
                                          buckets=_RTF, registry=r)
        r.register(_EngineCollector(state))

    def observe_request(self, route: str, method: str, status: int | None, seconds: float) -> None:
        """Count one answered request. Raises nothing."""
        self.requests.labels(route, method, str(status) if status is not None else "none").inc()
        self.duration.labels(route).observe(seconds)

    def observe_usage(self, route: str, prompt: int, completion: int, cached: int) -> None:
        """Count the usage one request was answered with. Raises nothing."""
        self.usage_prompt.labels(route).inc(max(0, prompt))
        self.usage_completion.labels(route).inc(max(0, completion))
        self.usage_cached.labels(route).inc(max(0, cached))

    def observe_stream_failure(self, route: str, code: str) -> None:
        """Count one stream that failed after its headers. Raises nothing."""
        self.stream_failures.labels(route, code).inc()

    def observe_session(self, route: str, status: int | None, seconds: float) -> None:
        """Count one websocket session as it ends. Raises nothing."""
        self.requests.labels(route, "WS", str(status) if status is not None else "none").inc()
        self.sessions.labels(route).observe(seconds)

    def observe_live_audio(self, seconds: float) -> None:
        """Add audio a live session took in (counted as it arrives, as a file's is once read). Raises nothing."""
        if seconds > 0:
            self.audio_seconds.inc(seconds)

    def observe_transcription(self, audio_seconds: float, wall_seconds: float) -> None:
        """Record one transcribed file. Raises nothing."""
        self.audio_seconds.inc(audio_seconds)
        if audio_seconds > 0:
            self.real_time_factor.observe(wall_seconds / audio_seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric. Raises nothing a scrape should see."""
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Reads engine.stats() (and speech stats) at scrape time."""

    def __init__(self, state: "AppState") -> None:
        self.state = state

    def describe(self) -> Iterable[Metric]:
        return []  # names depend on what the engine reports; nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        engine = self.state.engine
        stats: dict[str, Any] = {}
        if engine is not None:
            try:
                stats = engine.stats()
            except Exception:  # noqa: BLE001 — a scrape never fails over diagnostics
                stats = {}
        yield _gauge("tandem_ready", "1 when the server accepts requests", 1.0 if self.state.ready else 0.0)
        yield from _gc(GC_PAUSES.snapshot())
        for key, text in _ENGINE_GAUGES.items():
            if _number(stats.get(key)):
                yield _gauge(f"tandem_{key}", text, stats[key])
        for key, text in _ENGINE_TOTALS.items():
            if _number(stats.get(key)):
                yield _counter(f"tandem_engine_{key}", text, stats[key])
        prefix = stats.get("prefix_cache")
        if isinstance(prefix, dict):
            for key, text in _PREFIX_TOTALS.items():
                if _number(prefix.get(key)):
                    yield _counter(f"tandem_prefix_cache_{key}", text, prefix[key])
            if _number(prefix.get("bytes")):
                yield _gauge("tandem_prefix_cache_bytes", "Bytes of KV held by the prefix cache", prefix["bytes"])
            if _number(prefix.get("probation_bytes")):
                yield _gauge("tandem_prefix_cache_probation_bytes", "Bytes of prefix-cache entries never hit yet",
                             prefix["probation_bytes"])
        memory = stats.get("memory")
        if isinstance(memory, dict):
            yield from _memory(memory)
        isolate = stats.get("isolate")
        if isinstance(isolate, dict) and _number(isolate.get("restarts")):
            # --isolate: the engine process's counters above start again from 0 after each of these.
            yield _counter("tandem_engine_restarts", "Restarts of the --isolate engine process", isolate["restarts"])
        speech = self.state.speech
        if speech is not None:
            try:
                sp = speech.stats()
            except Exception:  # noqa: BLE001 — as above
                sp = {}
            if _number(sp.get("sessions_open")):
                yield _gauge("tandem_whisper_sessions_open", "Live sessions open", sp["sessions_open"])
            if _number(sp.get("loads")):
                yield _counter("tandem_whisper_loads", "Whisper model loads", sp["loads"])
            scheduler = sp.get("scheduler")
            if isinstance(scheduler, dict) and all(_number(scheduler.get(f"{k}_s")) for k in ("encode", "decode")):
                busy = CounterMetricFamily("tandem_whisper_step_seconds", "Seconds of Whisper encoder and decoder "
                                           "steps (against wall time: how near live speech is to falling behind)",
                                           labels=["kind"])
                for kind in ("encode", "decode"):
                    busy.add_metric([kind], float(scheduler[f"{kind}_s"]))
                yield busy


def _gc(snapshot: dict[str, Any]) -> Iterator[Metric]:
    count = CounterMetricFamily("tandem_gc_collections", "Python garbage collections in this process",
                                labels=["generation"])
    pause = CounterMetricFamily("tandem_gc_pause_seconds", "Seconds this process spent paused in garbage "
                                "collections (every thread waits)", labels=["generation"])
    for g, gen in enumerate(snapshot["generations"]):
        count.add_metric([str(g)], float(gen["collections"]))
        pause.add_metric([str(g)], gen["pause_ms_total"] / 1e3)
    yield count
    yield pause


def _memory(memory: dict[str, Any]) -> Iterator[Metric]:
    family = GaugeMetricFamily("tandem_memory_bytes", "Memory held now, by part", labels=["part"])
    for key, value in memory.items():
        if key != "budget" and _number(value):
            family.add_metric([key.removesuffix("_bytes")], float(value))
    yield family
    budget = memory.get("budget")
    if isinstance(budget, dict):
        parts = GaugeMetricFamily("tandem_memory_budget_bytes", "The memory budget, by part", labels=["part"])
        for key, value in budget.items():
            # kv_token_bytes, kv_row_bytes...: a row's or a token's share, not a part: summing parts must give bytes
            if _number(value) and not key.endswith("_bytes"):
                parts.add_metric([key], float(value))
        yield parts
        per_token = budget.get("kv_token_bytes", 0)
        if _number(per_token):
            yield _gauge("tandem_kv_bytes_per_token", "KV cache bytes one token takes (the layers that keep every "
                         "token)", float(per_token))
        per_row = budget.get("kv_row_bytes", 0)
        if _number(per_row):
            yield _gauge("tandem_kv_bytes_per_row", "KV cache bytes a row holds at most whatever its length (sliding "
                         "windows, recurrent states)", float(per_row))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=float(value))


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=float(value))
