"""pi's agent dir: merge our provider into models.json and fit the compaction reserve to a small context
window in settings.json — never clobbering what the user wrote.

pi auto-compacts after a turn once its context passes `contextWindow - compaction.reserveTokens`
(16384 by default) and waits for that summary (up to 0.8 x reserve tokens) before `pi -p` exits. On a
small-context local model that fires after every turn and takes many minutes on a CPU, so `tandem pi`
sets a reserve that fits the window, but only where the user has not chosen one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["agent_dir", "merge_provider", "fit_compaction"]

_PI_DEFAULT_RESERVE = 16384


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


def _write_json(path: Path, data: dict[str, Any], *, private: bool = False) -> None:
    # `private`: the file may hold API keys, so it is the user's alone (0600) from its first byte on.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tandem-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
    with os.fdopen(fd, "w") as file:
        if private:
            os.fchmod(file.fileno(), 0o600)  # a temp file left by an earlier crash keeps its old mode otherwise
        file.write(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)  # atomic: pi never reads a half-written file


def merge_provider(directory: Path, name: str, entry: dict[str, Any]) -> Path:
    """Set providers[name] in directory/models.json, keeping every other provider and key; the file is written
    0600 (it holds API keys).

    Raises ValueError when the existing file is not a JSON object, OSError when it cannot be written."""
    path = directory / "models.json"
    data = _read_json(path)
    providers = data.get("providers")
    if providers is None:
        providers = data["providers"] = {}
    if not isinstance(providers, dict):
        raise ValueError(f"{path}: 'providers' is not an object; it is left untouched")
    providers[name] = entry
    _write_json(path, data, private=True)
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
