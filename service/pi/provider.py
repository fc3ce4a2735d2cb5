"""The models.json provider entry that points the pi coding agent (`@mariozechner/pi-coding-agent`) at
mlx-tandem — built by the server (GET /v1/pi/provider) and, for other servers, by `tandem pi`."""

from __future__ import annotations

from typing import Any

__all__ = ["PROVIDER_NAME", "provider_entry", "has_thinking_switch", "thinking_format"]

PROVIDER_NAME = "mlx-tandem"


def has_thinking_switch(tokenizer: Any) -> bool:
    """True when the model has think markers and its chat template reads `enable_thinking`. Raises nothing."""
    if tokenizer is None or not getattr(tokenizer, "has_thinking", False):
        return False
    try:
        template = getattr(tokenizer, "chat_template", None)
    except Exception:  # a wrapper delegating to a tokenizer without the attribute
        return False
    return isinstance(template, str) and "enable_thinking" in template


def thinking_format(tokenizer: Any) -> str | None:
    """How pi asks this model to think: "qwen-chat-template" (`enable_thinking`), "harmony" (gpt-oss: its
    template reads `reasoning_effort`, which pi sends as OpenAI does), or None (pi cannot switch it). Raises
    nothing."""
    if has_thinking_switch(tokenizer):
        return "qwen-chat-template"
    from engine.harmony import is_harmony

    return "harmony" if tokenizer is not None and is_harmony(tokenizer) else None


# gpt-oss knows three efforts; pi has six levels ("off" sends none: the template's default, medium).
_HARMONY_LEVELS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def provider_entry(model_id: str, base_url: str, context_window: int, *, thinking: str | None) -> dict[str, Any]:
    """The models.json provider entry (api openai-completions) for one served model. `thinking`: its
    `thinking_format`, None for a model pi cannot make think. Raises nothing."""
    compat: dict[str, Any] = {
        "supportsDeveloperRole": True,
        "sendSessionAffinityHeaders": True,
        "supportsUsageInStreaming": True,
        "maxTokensField": "max_completion_tokens",
    }
    if thinking == "qwen-chat-template":
        compat["thinkingFormat"] = thinking
    elif thinking == "harmony":
        compat["supportsReasoningEffort"] = True
    model: dict[str, Any] = {
        "id": model_id,
        "name": f"{model_id} (mlx-tandem)",
        "reasoning": thinking is not None,
        "input": ["text"],
        "contextWindow": int(context_window),
        "maxTokens": max(256, min(8192, int(context_window) // 4)),
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
    }
    if thinking == "harmony":
        model["thinkingLevelMap"] = dict(_HARMONY_LEVELS)
    return {
        "baseUrl": base_url,
        "api": "openai-completions",
        "apiKey": PROVIDER_NAME,  # pi requires a key; the server ignores it
        "compat": compat,
        "models": [model],
    }
