"""A streaming OpenAI chat client for load: one request → one RequestResult, never raises, never hangs.

Every request gets an answer or a reason: HTTP status ≠ 200, an `error` event in the stream, a transport
error, no `data: [DONE]`, an empty answer, or the per-request timeout (counted as failed).
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import httpx

from bench.serve_stats import RequestResult

__all__ = ["make_client", "chat_body", "responses_body", "stream_chat"]


def make_client() -> httpx.AsyncClient:
    """One client for a whole scenario: no connection cap (c128 needs 128+ at once), no httpx timeout
    (the per-request timeout of stream_chat bounds each request). Raises nothing."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=256), timeout=None)


def chat_body(system: str, user: str, max_tokens: int, model: str | None = None) -> dict[str, Any]:
    """A greedy streamed chat request asking for usage in the last chunk. Raises nothing."""
    body: dict[str, Any] = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    return body


def responses_body(system: str, user: str, max_tokens: int, model: str | None = None) -> dict[str, Any]:
    """The same request for POST /v1/responses (usage comes in response.completed). Raises nothing."""
    body: dict[str, Any] = {"instructions": system, "input": user, "max_output_tokens": max_tokens,
                            "temperature": 0.0, "stream": True}
    if model:
        body["model"] = model
    return body


# A Responses stream's events: text deltas, and the events that end it.
_RESPONSE_TEXT = ("response.output_text.delta", "response.reasoning_text.delta",
                  "response.reasoning_summary_text.delta")
_RESPONSE_END = ("response.completed", "response.incomplete")


def _content(chunk: dict[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str):
                text += value
    return text


async def stream_chat(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout: float, disconnect_after: int | None = None,
    retries: int = 0,
) -> RequestResult:
    """POST `body` with stream=true and time every content chunk. Raises nothing (errors land in .error).

    `disconnect_after`: hang up after that many content chunks (0: right after the headers) — a client
    that goes away, counted as `disconnected`, not as failed. `retries`: send again after a transport
    error before any response header (as OpenAI's SDK does); the time lost counts in TTFT.
    """
    res = RequestResult(t_start=time.perf_counter())
    done = False
    try:
        with anyio.fail_after(max(timeout, 0.001)):
            for attempt in range(retries + 1):
                try:
                    done = await _read(client, url, body, res, disconnect_after)
                    break
                except (httpx.HTTPError, OSError):
                    if res.status is not None or attempt == retries:
                        raise
                    res.retries += 1
    except TimeoutError:
        res.error = f"timeout: no full answer within {timeout:.0f} s ({len(res.chunk_times)} chunks)"
    except (httpx.HTTPError, OSError) as exc:
        where = "before the response headers" if res.status is None else f"after {len(res.chunk_times)} chunks"
        res.error = f"transport: {type(exc).__name__} {where}: {exc}"[:300]
    except ValueError as exc:  # a data line that is not JSON
        res.error = f"bad_event: {exc}"[:300]
    finally:
        res.t_end = time.perf_counter()
    if res.error is None and not res.disconnected:
        if not done:
            res.error = "no_done: the stream ended without data: [DONE] (or response.completed)"
        elif not res.chunk_times and not res.completion_tokens:
            res.error = f"empty: no content and completion_tokens={res.completion_tokens}"
    return res


async def _read(client: httpx.AsyncClient, url: str, body: dict[str, Any], res: RequestResult,
                disconnect_after: int | None) -> bool:
    """One attempt: fill `res`; True when `data: [DONE]` arrived. Raises httpx.HTTPError, OSError, ValueError."""
    async with client.stream("POST", url, json=body) as resp:
        res.status = resp.status_code
        if resp.status_code != 200:
            detail = (await resp.aread())[:300].decode("utf-8", "replace")
            res.error = f"http_{resp.status_code}: {detail}"
            return False
        if disconnect_after == 0:
            res.disconnected = True
            return False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return True
            chunk = json.loads(data)
            kind = chunk.get("type")
            if isinstance(kind, str) and kind.startswith("response."):  # a Responses stream: no [DONE]
                if kind == "response.failed":
                    res.error = f"error_event: {json.dumps(chunk['response'].get('error'))[:300]}"
                    return False
                if kind in _RESPONSE_END:
                    usage = chunk["response"].get("usage") or {}
                    res.completion_tokens, res.prompt_tokens = usage.get("output_tokens"), usage.get("input_tokens")
                    return True
                if kind not in _RESPONSE_TEXT or not chunk.get("delta"):
                    continue
                chunk = {"choices": [{"delta": {"content": chunk["delta"]}}]}
            if chunk.get("error") is not None:
                res.error = f"error_event: {json.dumps(chunk['error'])[:300]}"
                return False
            usage = chunk.get("usage")
            if usage:
                res.completion_tokens = usage.get("completion_tokens")
                res.prompt_tokens = usage.get("prompt_tokens")
            text = _content(chunk)
            if text:
                res.chunk_times.append(time.perf_counter())
                res.chunk_texts.append(text)
                if disconnect_after is not None and len(res.chunk_times) >= disconnect_after:
                    res.disconnected = True
                    return False
    return False
