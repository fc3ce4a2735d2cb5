"""Assistant prefill: the reply continues the conversation's last, assistant, message (vLLM's
`continue_final_message`; Anthropic's last assistant turn, service/messages/translate.py).

The prompt is the chat template's rendering cut right after that message's text (apply_chat_template's
`continue_final_message`: no end of turn, no generation prompt) and the reply is the continuation alone, as vLLM
and Anthropic return it. The reply starts as content, in thinking only where the prefill itself opened a think
block and left it open: its own text decides, as a template's generation prompt does for a new turn. A grammar
that holds from the reply's first token (JSON output, a forced call) would have to start mid-text, so neither is
taken beside a prefill.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationInfo

from engine.harmony import START, is_harmony
from service.http.errors import APIError

__all__ = ["continued_message", "generation_prompt_asked", "check_no_grammar", "continued_opening"]


def continued_message(cls: Any, value: bool | None, info: ValidationInfo) -> bool | None:
    """A `continue_final_message` validator: the last message must be the assistant's, without tool calls (after
    calls comes their results' turn, not more of the message). Raises ValueError."""
    messages = info.data.get("messages")
    if not value or not messages:  # not asked, or the messages failed on their own
        return value
    last = messages[-1]
    if last.role != "assistant":
        raise ValueError(f"the last message must be the assistant's to continue, not the {last.role}'s")
    if last.tool_calls or last.function_call:
        field = "tool_calls" if last.tool_calls else "a function_call"
        raise ValueError(f"the last message has {field}: what follows calls is their results, not more of the "
                         "message; leave the calls out to continue its text")
    return value


def generation_prompt_asked(cls: Any, value: bool | None, info: ValidationInfo) -> bool | None:
    """An `add_generation_prompt` validator (declared after continue_final_message): true beside a continuation is
    vLLM's error; false alone is refused, as a prompt ending after the last turn leaves the model to write the next
    turn's header, which the reply would carry as text. Raises ValueError."""
    if "continue_final_message" not in info.data:  # that field failed: its error is the one to read
        return value
    continued = info.data["continue_final_message"]
    if value and continued:
        raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if value is False and not continued:
        raise ValueError("false is taken only with continue_final_message true: a prompt ending after the last "
                         "message leaves the model to write the next turn's header, which the reply would carry as "
                         "its text")
    return value


def check_no_grammar(response_format: dict[str, Any] | None, forced: str | bool) -> None:
    """Refuse, beside a continued message, what would be enforced from the reply's first token: JSON output
    (`response_format`) and a forced call (`forced`, tool_choice). Raises APIError 400 naming the field."""
    if response_format is not None and response_format.get("type") != "text":
        raise APIError(400, "response_format: JSON output is enforced from the reply's first token, and a continued "
                            "message's reply starts mid-text (write the JSON's opening in the message instead)",
                       param="response_format", code="unsupported_value")
    if forced:
        raise APIError(400, "tool_choice: a forced call is the reply from its first token, and a continued message's "
                            "reply starts mid-text; use \"auto\" or end with a user turn", param="tool_choice",
                       code="unsupported_value")


def continued_opening(tokenizer: Any, text: str, prefill: str) -> str:
    """What a continued reply opens with, for its splitter and grammar (as a generation prompt is for a new turn,
    engine/chat_output.py opens_reasoning): the prefill's own text; for a harmony model (gpt-oss) the rendered turn
    from its `<|start|>`, whose header names the channel the reply goes on in. `text`: the rendered prompt. Raises
    nothing."""
    if is_harmony(tokenizer) and (start := text.rfind(START)) >= 0:
        return text[start:]
    return prefill
