"""vLLM's and SGLang's thinking switch beside `reasoning_effort`, as their clients send it (Dify's OpenAI-API-compatible
plugin, in its extended mode, sends `enable_thinking` and `thinking` with every request, beside
`chat_template_kwargs`): top-level `enable_thinking: bool`, `thinking: {"type": "enabled" | "disabled"}`, and
`reasoning_format`.

The switch asks what `reasoning_effort` asks — off is its "none", on an effort the template picks — so it reaches
the template the same way (service/chat/prompt.py template_kwargs); fields that disagree are refused by name. No
reasoning budget is enforced here (max_tokens bounds the whole reply), so `thinking.budget_tokens` is refused. The
thinking always goes to `reasoning_content`: the formats that say so are taken, those that leave it in `content`
are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from service.chat.strict_body import _Request

__all__ = ["ThinkingSwitch", "AskedThinking", "asked_thinking", "kwargs_agree", "switch_agrees",
           "reasoning_format_taken", "REASONING_FORMATS"]

# llama.cpp's and SGLang's reasoning_format values this server delivers: the thinking in reasoning_content.
REASONING_FORMATS = ("auto", "deepseek")
# The values it cannot: the thinking left in content, unparsed ("none") or tagged beside reasoning_content.
_IN_CONTENT = ("none", "deepseek-legacy")


class ThinkingSwitch(_Request):
    """`thinking` as vLLM's and SGLang's clients send it (DeepSeek's, GLM's and Kimi's shape)."""

    type: Literal["enabled", "disabled"] = Field(..., description="enabled / disabled: as chat_template_kwargs' "
                                                                  "enable_thinking true / false.")
    budget_tokens: int | None = Field(None, description="Only null: no reasoning budget is enforced here "
                                                        "(max_tokens bounds the reply).")

    @field_validator("budget_tokens")
    @classmethod
    def _no_budget(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("no reasoning budget is enforced by this server (max_tokens bounds the whole reply, "
                             "thinking included): leave budget_tokens out")
        return value


@dataclass(frozen=True)
class AskedThinking:
    """What a request asks of the model's thinking, and the field that asked (named in a refusal)."""

    field: str
    # "none": off; another effort: on at that effort; None: on, at the template's own effort.
    effort: str | None

    @property
    def on(self) -> bool:
        return self.effort != "none"


def asked_thinking(reasoning_effort: str | None, enable_thinking: bool | None,
                   thinking: ThinkingSwitch | None) -> AskedThinking | None:
    """What the request's reasoning fields ask (they agree: switch_agrees refused any that did not), None when it
    sets none of them. Raises nothing."""
    if reasoning_effort is not None:
        return AskedThinking("reasoning_effort", reasoning_effort)
    if enable_thinking is not None:
        return AskedThinking("enable_thinking", None if enable_thinking else "none")
    if thinking is not None:
        return AskedThinking("thinking.type", None if thinking.type == "enabled" else "none")
    return None


def _said(on: bool) -> str:
    return "on" if on else "off"


def kwargs_agree(asks: str, on: bool, kwargs: dict[str, Any]) -> None:
    """Refuses chat_template_kwargs' enable_thinking or thinking where it contradicts a switch (`asks`, asking thinking
    `on` or off), or is no boolean beside it: a string "false" reached the template, which took it as true. Raises
    ValueError."""
    for key in ("enable_thinking", "thinking"):
        given = kwargs.get(key)
        if given is not None and not isinstance(given, bool):
            raise ValueError(f"{asks} switches thinking {_said(on)}, but chat_template_kwargs.{key} is "
                             f"{given!r}, not true or false; send one, or both the same")
        if given is not None and given != on:
            raise ValueError(f"{asks} switches thinking {_said(on)}, but chat_template_kwargs.{key} is "
                             f"{str(given).lower()}; send one, or both the same")


def switch_agrees(field: str, asks: str, on: bool, info: ValidationInfo) -> None:
    """Refuses the switch `field` (`asks`: its value as sent, asking thinking `on` or off) where the fields validated
    before it contradict it: reasoning_effort, chat_template_kwargs' enable_thinking and thinking, enable_thinking.
    Raises ValueError (pydantic names `field` before its words)."""
    data = info.data
    effort = data.get("reasoning_effort")
    if effort is not None and (effort != "none") != on:
        raise ValueError(f"{asks} switches thinking {_said(on)}, but reasoning_effort {effort!r} switches it "
                         f"{_said(effort != 'none')}; send one, or both the same")
    kwargs_agree(asks, on, data.get("chat_template_kwargs") or {})
    enable = data.get("enable_thinking")
    if field != "enable_thinking" and enable is not None and enable != on:
        raise ValueError(f"{asks} switches thinking {_said(on)}, but enable_thinking is {str(enable).lower()}; "
                         "send one, or both the same")


def reasoning_format_taken(value: str | None) -> str | None:
    """A `reasoning_format` validator: the values whose thinking goes to reasoning_content, as here. Raises
    ValueError for the rest."""
    if value is None or value in REASONING_FORMATS:
        return value
    if value in _IN_CONTENT:
        raise ValueError(f"{value!r} leaves the thinking in content, which this server does not: the thinking goes "
                         f"to reasoning_content (send {' or '.join(map(repr, REASONING_FORMATS))}, or leave it out)")
    raise ValueError(f"{value!r} is not a reasoning format: {' or '.join(map(repr, REASONING_FORMATS))} (the "
                     "thinking in reasoning_content)")
