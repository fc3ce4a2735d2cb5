"""The pi coding agent (`@mariozechner/pi-coding-agent`) against mlx-tandem.

`GET /v1/pi/provider` returns a models.json document with the provider entry for the served model.
`tandem pi [--host H] [--port P] [--serve-model M] [--] [pi args...]` merges that entry into pi's
agent dir, starts `tandem serve` in the background when nothing answers on the port, and execs pi.

pi auto-compacts after a turn once its context passes `contextWindow - compaction.reserveTokens`
(16384 by default) and waits for that summary (up to 0.8 x reserve tokens) before `pi -p` exits. On a
small-context local model that fires after every turn and takes many minutes on a CPU, so `tandem pi`
also sets a reserve that fits the window, but only where the user has not chosen one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from litestar import Request, get

from service.app import get_state

__all__ = [
    "ROUTES",
    "PROVIDER_NAME",
    "INSTALL_HINT",
    "pi_provider",
    "provider_entry",
    "has_thinking_switch",
    "agent_dir",
    "merge_provider",
    "fit_compaction",
    "find_pi",
    "pi_command",
    "add_pi_parser",
]

PROVIDER_NAME = "mlx-tandem"
INSTALL_HINT = "npm install -g @mariozechner/pi-coding-agent"
_PI_DEFAULT_RESERVE = 16384


def has_thinking_switch(tokenizer: Any) -> bool:
    """True when the model has think markers and its chat template reads `enable_thinking`. Raises nothing."""
    if tokenizer is None or not getattr(tokenizer, "has_thinking", False):
        return False
    try:
        template = getattr(tokenizer, "chat_template", None)
    except Exception:  # a wrapper delegating to a tokenizer without the attribute
        return False
    return isinstance(template, str) and "enable_thinking" in template


def provider_entry(model_id: str, base_url: str, context_window: int, *, reasoning: bool) -> dict[str, Any]:
    """The models.json provider entry (api openai-completions) for one served model. Raises nothing."""
    compat: dict[str, Any] = {
        "supportsDeveloperRole": True,
        "sendSessionAffinityHeaders": True,
        "supportsUsageInStreaming": True,
        "maxTokensField": "max_completion_tokens",
    }
    if reasoning:
        compat["thinkingFormat"] = "qwen-chat-template"
    return {
        "baseUrl": base_url,
        "api": "openai-completions",
        "apiKey": PROVIDER_NAME,  # pi requires a key; the server ignores it
        "compat": compat,
        "models": [
            {
                "id": model_id,
                "name": f"{model_id} (mlx-tandem)",
                "reasoning": reasoning,
                "input": ["text"],
                "contextWindow": int(context_window),
                "maxTokens": max(256, min(8192, int(context_window) // 4)),
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            }
        ],
    }


@get("/v1/pi/provider", summary="pi provider definition", tags=["pi"],
     description="A models.json document (`{\"providers\": {\"mlx-tandem\": {...}}}`) for the pi coding agent.")
async def pi_provider(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The provider entry for the loaded chat model; `models` is empty when no chat model is loaded. Raises nothing."""
    state = get_state(request)
    base_url = str(request.base_url).rstrip("/") + "/v1"
    name = state.chat_model_name
    if name is None:
        entry = provider_entry("none", base_url, 4096, reasoning=False)
        entry["models"] = []
    else:
        engine = state.engine
        context = getattr(engine, "context_length", None) or 4096
        entry = provider_entry(name, base_url, context, reasoning=has_thinking_switch(getattr(engine, "tokenizer", None)))
    return {"providers": {PROVIDER_NAME: entry}}


ROUTES = [pi_provider]


# ---------------------------------------------------------------- the agent dir


def agent_dir(environ: dict[str, str] | None = None) -> Path:
    """PI_CODING_AGENT_DIR, else ~/.pi/agent (pi's own rule). Raises nothing."""
    env = os.environ if environ is None else environ
    return Path(env["PI_CODING_AGENT_DIR"]).expanduser() if env.get("PI_CODING_AGENT_DIR") else Path.home() / ".pi" / "agent"


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text() or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix it first, it is left untouched") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object; it is left untouched")
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tandem-tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)  # atomic: pi never reads a half-written file


def merge_provider(directory: Path, name: str, entry: dict[str, Any]) -> Path:
    """Set providers[name] in directory/models.json, keeping every other provider and key.

    Raises ValueError when the existing file is not a JSON object, OSError when it cannot be written."""
    path = directory / "models.json"
    data = _read_json(path)
    providers = data.get("providers")
    if providers is None:
        providers = data["providers"] = {}
    if not isinstance(providers, dict):
        raise ValueError(f"{path}: 'providers' is not an object; it is left untouched")
    providers[name] = entry
    _write_json(path, data)
    return path


def fit_compaction(directory: Path, context_window: int) -> dict[str, int] | None:
    """Give pi a compaction reserve that fits a small window, unless settings.json already sets one.

    Returns the values written, or None when nothing changed. Raises ValueError for an invalid
    settings.json and OSError when it cannot be written."""
    if context_window >= 2 * _PI_DEFAULT_RESERVE:
        return None
    path = directory / "settings.json"
    data = _read_json(path)
    compaction = data.get("compaction")
    if compaction is None:
        compaction = data["compaction"] = {}
    if not isinstance(compaction, dict) or "reserveTokens" in compaction:
        return None
    written = {"reserveTokens": max(256, context_window // 4)}
    if "keepRecentTokens" not in compaction:
        written["keepRecentTokens"] = max(256, context_window // 4)
    compaction.update(written)
    _write_json(path, data)
    return written


# ---------------------------------------------------------------- the server


def _get_json(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    import httpx

    response = httpx.get(url, timeout=timeout)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, None


def _answers(base: str) -> bool:
    import httpx

    try:
        _get_json(f"{base}/health")
        return True
    except httpx.HTTPError:
        return False


def _start_server(host: str, port: int, model: str | None, log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "service.cli", "serve", *([model] if model else []), "--host", host, "--port", str(port)]
    with open(log_path, "ab") as log:
        # Its own session: Ctrl-C in pi must not stop the server, which outlives this command.
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _wait_ready(base: str, process: subprocess.Popen[bytes] | None, log_path: Path, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            raise RuntimeError(f"tandem serve exited with code {process.returncode}:\n{tail}")
        try:
            status, _ = _get_json(f"{base}/health")
            if status == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # polling a starting process: there is nothing to wait on but the port
    raise RuntimeError(f"no ready server on {base} after {timeout:.0f} s (log: {log_path})")


def _provider_from_server(base: str) -> dict[str, Any]:
    status, doc = _get_json(f"{base}/v1/pi/provider", timeout=10)
    if status == 200 and isinstance(doc, dict) and doc.get("providers", {}).get(PROVIDER_NAME, {}).get("models"):
        return doc["providers"][PROVIDER_NAME]
    # Another OpenAI-compatible server (or an older tandem): build the entry from /v1/models.
    status, models = _get_json(f"{base}/v1/models", timeout=10)
    cards = models.get("data", []) if isinstance(models, dict) else []
    chat = next((c for c in cards if c.get("kind", "chat") == "chat"), None)
    if status != 200 or chat is None:
        raise RuntimeError(f"the server on {base} serves no chat model")
    return provider_entry(chat["id"], f"{base}/v1", chat.get("context_length") or 4096, reasoning=False)


def find_pi(environ: dict[str, str] | None = None) -> str | None:
    """TANDEM_PI_BIN, else `pi` on PATH. Raises nothing."""
    env = os.environ if environ is None else environ
    if explicit := env.get("TANDEM_PI_BIN"):
        return explicit if Path(explicit).exists() else None
    return shutil.which("pi", path=env.get("PATH"))


# ---------------------------------------------------------------- `tandem pi`


def _split_args(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Our leading options (--host, --port, --serve-model), then pi's arguments (after an optional --)."""
    ours: dict[str, str] = {}
    args = list(argv)
    while args and args[0] in ("--host", "--port", "--serve-model"):
        if len(args) < 2:
            raise ValueError(f"{args[0]} needs a value")
        ours[args[0][2:]] = args[1]
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    return ours, args


def pi_command(
    argv: Sequence[str],
    *,
    environ: dict[str, str] | None = None,
    exec_fn: Callable[[str, list[str], dict[str, str]], Any] = os.execvpe,
    ready_timeout: float = 900.0,
) -> int:
    """`tandem pi`: write the provider, make sure a server answers, exec pi (returns only on failure).

    Returns 127 when pi is not installed, 2 for bad arguments or config files, 1 when no server starts."""
    env = dict(os.environ if environ is None else environ)
    try:
        ours, pi_args = _split_args(argv)
        port = int(ours.get("port", env.get("TANDEM_PORT", "8080")))
    except ValueError as exc:
        print(f"tandem pi: {exc}", file=sys.stderr)
        return 2
    host = ours.get("host", "127.0.0.1")
    pi = find_pi(env)
    if pi is None:
        print(f"tandem pi: pi is not installed; install it with: {INSTALL_HINT}", file=sys.stderr)
        return 127
    base = f"http://{host}:{port}"
    log_path = Path(env.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlx-tandem" / f"serve-{port}.log"
    try:
        process = None
        if not _answers(base):
            process = _start_server(host, port, ours.get("serve-model"), log_path)
            print(f"tandem pi: started tandem serve (pid {process.pid}) on {base}; log: {log_path}", file=sys.stderr)
        _wait_ready(base, process, log_path, ready_timeout)
        entry = _provider_from_server(base)
    except RuntimeError as exc:
        print(f"tandem pi: {exc}", file=sys.stderr)
        return 1
    directory = agent_dir(env)
    try:
        path = merge_provider(directory, PROVIDER_NAME, entry)
        model = entry["models"][0]
        fitted = fit_compaction(directory, int(model["contextWindow"]))
    except (ValueError, OSError) as exc:
        print(f"tandem pi: {exc}", file=sys.stderr)
        return 2
    print(f"tandem pi: provider {PROVIDER_NAME} ({model['id']}) written to {path}", file=sys.stderr)
    if fitted:
        print(f"tandem pi: compaction settings {fitted} written to {directory / 'settings.json'} "
              f"(context window {model['contextWindow']})", file=sys.stderr)
    if "--provider" not in pi_args and "--model" not in pi_args:
        pi_args = ["--provider", PROVIDER_NAME, "--model", model["id"], *pi_args]
    exec_fn(pi, [pi, *pi_args], env)
    return 0


def add_pi_parser(sub: Any) -> None:
    """Register `tandem pi` for --help; service.cli.main hands `pi ...` to pi_command unparsed. Raises nothing."""
    import argparse

    p = sub.add_parser(
        "pi",
        help="run the pi coding agent against this server (starts one if needed)",
        description="tandem pi [--host H] [--port P] [--serve-model M] [--] [pi arguments...]",
    )
    p.add_argument("pi_args", nargs=argparse.REMAINDER, help="passed to pi unchanged (e.g. -p \"question\")")
    p.set_defaults(func=lambda args: pi_command(args.pi_args))
