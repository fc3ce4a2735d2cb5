"""`tandem pi [--host H] [--port P] [--serve-model M] [--api-key K] [--] [pi args...]`: merge the provider entry into
pi's agent dir, start `tandem serve` in the background when nothing answers on the port, exec pi.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from service.config import API_KEY_ENV, base_url, split_list, unbracketed
from service.pi.agent_files import agent_dir, fit_compaction, merge_provider
from service.pi.provider import PROVIDER_NAME, provider_entry

__all__ = ["INSTALL_HINT", "find_pi", "pi_command", "split_args"]

INSTALL_HINT = "npm install -g @mariozechner/pi-coding-agent"


# ---------------------------------------------------------------- the server


def _get_json(url: str, timeout: float = 2.0, key: str | None = None) -> tuple[int, Any]:
    import httpx

    response = httpx.get(url, timeout=timeout, headers={"Authorization": f"Bearer {key}"} if key else None)
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


def _start_server(host: str, port: int, model: str | None, log_path: Path,
                  env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "service.cli", "serve", *([model] if model else []), "--host", host, "--port", str(port)]
    with open(log_path, "ab") as log:
        # Its own session: Ctrl-C in pi must not stop the server, which outlives this command.
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)


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


def _provider_from_server(base: str, key: str | None = None) -> dict[str, Any]:
    """The provider entry for the server's chat model, with `key` as its apiKey when given. Raises
    RuntimeError when the server refuses the key or serves no chat model."""
    status, doc = _get_json(f"{base}/v1/pi/provider", timeout=10, key=key)
    _check_key(base, status, key)
    if status == 200 and isinstance(doc, dict) and doc.get("providers", {}).get(PROVIDER_NAME, {}).get("models"):
        entry = dict(doc["providers"][PROVIDER_NAME])
    else:
        # Another OpenAI-compatible server (or an older tandem): build the entry from /v1/models.
        status, models = _get_json(f"{base}/v1/models", timeout=10, key=key)
        _check_key(base, status, key)
        cards = models.get("data", []) if isinstance(models, dict) else []
        chat = next((c for c in cards if c.get("kind", "chat") == "chat"), None)
        if status != 200 or chat is None:
            raise RuntimeError(f"the server on {base} serves no chat model")
        # What a request can use: vLLM's max_model_len, else our context_length (the same here).
        context = chat.get("max_model_len") or chat.get("context_length") or 4096
        entry = provider_entry(chat["id"], f"{base}/v1", context, thinking=None)
    if key:
        entry["apiKey"] = key  # pi sends it with every request
    return entry


def _check_key(base: str, status: int, key: str | None) -> None:
    if status in (401, 403):
        if key:
            raise RuntimeError(f"the server on {base} refused the API key (HTTP {status}): check --api-key / "
                               f"{API_KEY_ENV}")
        raise RuntimeError(f"the server on {base} needs an API key (HTTP {status}): pass --api-key or set "
                           f"{API_KEY_ENV}")


def find_pi(environ: dict[str, str] | None = None) -> str | None:
    """TANDEM_PI_BIN, else `pi` on PATH. Raises nothing."""
    env = os.environ if environ is None else environ
    if explicit := env.get("TANDEM_PI_BIN"):
        return explicit if Path(explicit).exists() else None
    return shutil.which("pi", path=env.get("PATH"))


# ---------------------------------------------------------------- `tandem pi`


_OPTIONS = ("--host", "--port", "--serve-model", "--api-key")


def split_args(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Our leading options (--host, --port, --serve-model, --api-key; `--opt value` or `--opt=value`), then pi's
    arguments (after an optional --). Raises ValueError for an option without its value."""
    ours: dict[str, str] = {}
    args = list(argv)
    while args:
        option, equals, value = args[0].partition("=")
        if option not in _OPTIONS:
            break
        if equals:
            # `--port=N` is ours too: passed on to pi, it would leave our server on the default port.
            ours[option[2:]] = value
            args = args[1:]
            continue
        if len(args) < 2:
            raise ValueError(f"{args[0]} needs a value")
        ours[option[2:]] = args[1]
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    return ours, args


def _port(text: str, name: str) -> int:
    """A port number from --port or TANDEM_PORT. Raises ValueError naming where it came from."""
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"{name} must be in 1..65535, got {port}")
    return port


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
        ours, pi_args = split_args(argv)
        port = _port(ours["port"] if "port" in ours else env.get("TANDEM_PORT", "8080"),
                     "--port" if "port" in ours else "TANDEM_PORT")
    except ValueError as exc:
        print(f"tandem pi: {exc}", file=sys.stderr)
        return 2
    if "api-key" in ours and not ours["api-key"].strip():
        print("tandem pi: --api-key is empty (an unset variable?)", file=sys.stderr)
        return 2
    keys = split_list(ours.get("api-key")) or split_list(env.get(API_KEY_ENV))
    key = keys[0] if keys else None
    host = unbracketed(ours.get("host", "127.0.0.1"))  # brackets belong in URLs; `tandem serve --host` takes it bare
    pi = find_pi(env)
    if pi is None:
        if explicit := env.get("TANDEM_PI_BIN"):
            # The user chose this path: the fix is there, not in installing pi again.
            print(f"tandem pi: TANDEM_PI_BIN is {explicit!r}, which does not exist", file=sys.stderr)
        else:
            print(f"tandem pi: pi is not installed; install it with: {INSTALL_HINT}", file=sys.stderr)
        return 127
    base = base_url(host, port)
    try:
        import httpx

        httpx.URL(f"{base}/health")  # a bad --host fails here, as an error to the user, not a traceback later
    except httpx.InvalidURL as exc:
        print(f"tandem pi: --host {host!r} gives no valid URL ({exc})", file=sys.stderr)
        return 2
    log_path = Path(env.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlx-tandem" / f"serve-{port}.log"
    process = None
    try:
        if not _answers(base):
            # A key given here is the key of the server started here too (through the environment, not argv).
            process = _start_server(host, port, ours.get("serve-model"), log_path,
                                    {**env, API_KEY_ENV: key} if key else env)
            print(f"tandem pi: started tandem serve (pid {process.pid}) on {base}; log: {log_path}", file=sys.stderr)
        _wait_ready(base, process, log_path, ready_timeout)
        entry = _provider_from_server(base, key)
    except RuntimeError as exc:
        print(f"tandem pi: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        still = f"; tandem serve (pid {process.pid}) goes on starting in the background" if process else ""
        print(f"\ntandem pi: interrupted{still}", file=sys.stderr)
        return 130
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


