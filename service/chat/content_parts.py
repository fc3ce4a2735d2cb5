"""Message content as a list of parts, for a template that reads it so (text parts; thinking chunks).

Templates take a message's content as a string, and most also take OpenAI's list of parts. Some read only parts
where it counts: early Gemma 3 templates (in many converted checkpoints) read the system message as
`messages[0]['content'][0]['text']`, so every conversation with a system message was refused ("'str object' has no
attribute 'text'"). For such a template every message's text goes as one text part, as vLLM's "openai" content
format does.
"""

from __future__ import annotations

import re
from typing import Any, Collection

__all__ = ["reads_text_parts", "as_text_parts", "reads_thinking_parts", "with_thinking_parts"]

# `content[0]['text']`, `content'][0]['text']`, `content[0].text`: a template indexing into the parts.
_INDEXES_PARTS = re.compile(r"""content(?:['"]\])?\s*\[\s*0\s*\]\s*(?:\[\s*['"]text['"]\s*\]|\.text)""")
# `block['type'] == 'thinking'`: earlier reasoning read from content chunks (Mistral's reasoning templates).
_READS_THINKING = re.compile(r"""(?:\[\s*['"]type['"]\s*\]|\.type)\s*==\s*['"]thinking['"]""")


def reads_text_parts(template_sources: Collection[str] | None) -> bool:
    """True for a chat template that indexes into a message's content parts. Raises nothing."""
    return any(_INDEXES_PARTS.search(text) for text in template_sources or ())


def as_text_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each string content as one text part (copies). Raises nothing."""
    return [dict(m, content=[{"type": "text", "text": m["content"]}]) if isinstance(m.get("content"), str) else m
            for m in messages]


def reads_thinking_parts(template_sources: Collection[str] | None) -> bool:
    """True for a chat template that reads earlier reasoning from `thinking` content chunks (Magistral, Ministral
    3 Reasoning), not from a message field. Raises nothing."""
    return any(_READS_THINKING.search(text) for text in template_sources or ())


def with_thinking_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with an assistant's earlier reasoning as a `thinking` chunk before its text (copies), for a
    template that reads it so: given as `reasoning_content` it was silently dropped. Raises nothing."""
    out = []
    for m in messages:
        reasoning = m.get("reasoning_content")
        if m.get("role") != "assistant" or not reasoning or not isinstance(m.get("content"), str):
            out.append(m)
            continue
        parts: list[dict[str, Any]] = [{"type": "thinking", "thinking": reasoning}]
        if m["content"]:
            parts.append({"type": "text", "text": m["content"]})
        # the chunk now carries the reasoning: not the fields too, which a template reading both would repeat
        out.append({k: v for k, v in m.items() if k not in ("reasoning_content", "thinking")} | {"content": parts})
    return out
