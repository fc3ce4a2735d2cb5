"""`bench.serve --smoke`: start ours, send one streamed and one plain chat request, check both answer."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
from pathlib import Path
from typing import Any

import anyio

from bench.serve import _argv, _free_port, _run_async
from bench.serve_client import chat_body, make_client, stream_chat
from bench.serve_procs import Server
from bench.serve_prompts import PromptMaker

__all__ = ["smoke"]


def smoke(a: argparse.Namespace, model_dir: str) -> int:
    """Start ours, one streamed and one non-streamed chat request; 0 when both return text. Raises nothing."""
    port = _free_port()
    argv = _argv(a.ours_cmd, model_dir, port, a.ours_args)
    server = Server("smoke", argv, f"http://127.0.0.1:{port}", Path(a.log_dir) / "smoke.log")
    out: dict[str, Any] = {"command": shlex.join(argv), "model_dir": model_dir, "date": datetime.datetime.now().isoformat()}
    maker = PromptMaker(a.tokenizer or model_dir, seed=a.seed)
    system, user = maker.make(0, 64, "smoke")
    try:
        server.start()
        out["ready_s"] = round(server.wait_ready(a.ready_path, a.ready_timeout), 2)

        async def go() -> None:
            async with make_client() as client:
                r = await stream_chat(client, server.base_url + "/v1/chat/completions",
                                      chat_body(system, user, 16, a.model_name), a.timeout)
                out["streamed"] = {"ok": r.ok, "error": r.error, "status": r.status, "chunks": len(r.chunk_texts),
                                   "text": "".join(r.chunk_texts)[:200], "usage_completion_tokens": r.completion_tokens,
                                   "usage_prompt_tokens": r.prompt_tokens}
                body = chat_body(system, user, 16, a.model_name) | {"stream": False}
                body.pop("stream_options")
                with anyio.fail_after(a.timeout):
                    resp = await client.post(server.base_url + "/v1/chat/completions", json=body)
                reply = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
                text = ((reply.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
                out["plain"] = {"status": resp.status_code, "text": text[:200], "usage": reply.get("usage"),
                                "error": reply.get("error")}

        _run_async(go)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["exit_code"] = server.stop()
    streamed, plain = out.get("streamed") or {}, out.get("plain") or {}
    out["ok"] = bool(streamed.get("ok") and streamed.get("text") and plain.get("status") == 200 and plain.get("text"))
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0 if out["ok"] else 1
