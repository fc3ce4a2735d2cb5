"""What a checkpoint's generation_config.json recommends: end-of-sequence ids, and defaults for the request fields a
client leaves out (sampling settings, max_new_tokens as max_tokens), as transformers and vLLM read them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["generation_eos_ids", "sampling_defaults"]

_log = logging.getLogger(__name__)


def _generation_config(directory: Path | None, *, quiet: bool = False) -> tuple[Path, dict[str, Any]] | None:
    """generation_config.json of `directory` and its fields; None when it has none (or it is not a JSON object: a
    warning unless `quiet`, so that one load warns once). Raises nothing."""
    path = directory / "generation_config.json" if directory is not None else None
    if path is None or not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict):
        if not quiet:
            _log.warning("%s is not a readable JSON object: its recommendations are not used", path)
        return None
    return path, config


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def generation_eos_ids(directory: Path | None) -> list[int] | None:
    """The end-of-sequence ids generation_config.json names (an int or a list; 0 is an id like any other), which
    replace config.json's as in transformers and mlx-lm; None when it names none usable. Raises nothing."""
    found = _generation_config(directory, quiet=True)
    if found is None or found[1].get("eos_token_id") is None:
        return None
    path, value = found[0], found[1]["eos_token_id"]
    ids = value if isinstance(value, list) else [value]
    if all(_is_token_id(i) for i in ids):
        return list(ids) or None  # [] names none: config.json's stand, as in mlx-lm
    _log.warning("%s: eos_token_id %r is not a token id or a list of them and is not used", path, value)
    return None


_SAMPLING_KEYS: dict[str, Any] = {
    "temperature": lambda v: 0 <= v <= 100, "top_p": lambda v: 0 < v <= 1, "top_k": lambda v: v >= 0 and v == int(v),
    "min_p": lambda v: 0 <= v <= 1, "repetition_penalty": lambda v: 0 < v <= 100,
    "max_new_tokens": lambda v: v >= 1 and v == int(v),
}
# generation_config.json's names that differ from the request fields they fill (vLLM reads max_new_tokens so).
_FIELD_NAMES = {"max_new_tokens": "max_tokens"}


def sampling_defaults(directory: Path | None) -> dict[str, float]:
    """The settings a model's generation_config.json recommends for request fields left out, by field name (Llama 3:
    temperature 0.6, top_p 0.9; Qwen3 adds top_k 20; max_new_tokens becomes max_tokens), as vLLM applies them. Values
    outside their range are dropped with a warning; max_length (prompt + reply) is not used, and the log says so.
    Raises nothing."""
    found = _generation_config(directory)
    if found is None:
        return {}
    path, config = found
    out: dict[str, float] = {}
    for key, valid in _SAMPLING_KEYS.items():
        value = config.get(key)
        if value is None:
            continue
        if key == "top_k" and value == -1 and not isinstance(value, bool):
            value = 0  # vLLM's and transformers' configs say "no top-k" so, as requests do here
        if isinstance(value, (int, float)) and not isinstance(value, bool) and valid(value):
            out[_FIELD_NAMES.get(key, key)] = int(value) if key in ("top_k", "max_new_tokens") else float(value)
        else:
            _log.warning("%s: %s %r is out of range and not used", path, key, value)
    if config.get("max_length") is not None:
        # A bound on prompt + reply has no request field to fill; the server's --max-tokens-cap and the context apply.
        bound = "max_new_tokens" if "max_tokens" in out else "--max-tokens-cap"
        _log.info("%s: max_length %r (prompt + reply) is not used: a request without max_tokens stops at %s or the "
                  "context's end", path, config["max_length"], bound)
    return out


# Files one of which a tokenizer needs: fast (tokenizer.json), sentencepiece, GPT-2 style BPE, tiktoken.
