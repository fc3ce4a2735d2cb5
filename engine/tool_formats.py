"""Tool-call formats mlx-lm does not find on its own.

mlx-lm picks a tool parser from a single chat template's text. Two kinds of real checkpoints get none, so their
calls reached clients as content with finish_reason "stop": those whose template is a set of named templates
(Hermes 2 Pro and 3: `default` and `tool_use`, the one transformers renders when tools are given), and Granite
3.x, whose template asks for `<|tool_call|>` followed by a JSON list and for which mlx-lm has no parser.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any, Callable

from engine.per_tokenizer import PerTokenizer

__all__ = ["GRANITE_START", "ToolFormat", "fallback_tool_format", "parse_json_list"]

GRANITE_START = "<|tool_call|>"


@dataclass(frozen=True)
class ToolFormat:
    """Where a call starts and ends in the reply (an empty end: it runs to the end) and how its text parses."""

    start: str
    end: str
    parse: Callable[[str, Any], Any]


def parse_json_list(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """Granite's calls: a JSON list (or one object) of {"name", "arguments"}. Raises ValueError (json's
    JSONDecodeError included) for anything else."""
    del tools
    parsed = json.loads(text.strip())
    calls = parsed if isinstance(parsed, list) else [parsed]
    if not calls or not all(isinstance(call, dict) for call in calls):
        raise ValueError(f"not a list of calls: {text[:80]!r}")
    return calls


def fallback_tool_format(tokenizer: Any) -> ToolFormat | None:
    """The tool-call format of a tokenizer mlx-lm gave no parser (found once per tokenizer), or None. Raises
    nothing."""
    return _FORMATS.get(tokenizer)


def _find(tokenizer: Any) -> ToolFormat | None:
    try:
        templates = getattr(tokenizer, "chat_template", None)
        if isinstance(templates, dict):
            # transformers renders `tool_use` when a request has tools: its format is the calls' format.
            ordered = [templates.get("tool_use"), *templates.values()]
            for text in ordered:
                if isinstance(text, str) and (found := _mlx_lm_format(tokenizer, text)) is not None:
                    return found
        texts = list(templates.values()) if isinstance(templates, dict) else [templates]
        if any(isinstance(text, str) and GRANITE_START in text for text in texts):
            vocab = tokenizer.get_vocab()
            if GRANITE_START in vocab:
                return ToolFormat(GRANITE_START, "", parse_json_list)
    except Exception:  # noqa: BLE001 — a tokenizer that cannot be read has no format we know
        return None
    return None


def _mlx_lm_format(tokenizer: Any, template: str) -> ToolFormat | None:
    """mlx-lm's own inference (its private `_infer_tool_parser`) run on one named template."""
    from mlx_lm import tokenizer_utils

    infer = getattr(tokenizer_utils, "_infer_tool_parser", None)
    if infer is None:
        return None

    class _OneTemplate:
        chat_template = template

        @staticmethod
        def get_vocab() -> dict[str, int]:
            return dict(tokenizer.get_vocab())

    name = infer(_OneTemplate())
    if name is None:
        return None
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    return ToolFormat(module.tool_call_start, module.tool_call_end, module.parse_tool_call)


_FORMATS = PerTokenizer(_find)
