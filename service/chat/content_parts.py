"""Message content as a list of parts, for a template that reads it so.

Templates take a message's content as a string, and most also take OpenAI's list of parts. Some read only parts
where it counts: early Gemma 3 templates (in many converted checkpoints) read the system message as
`messages[0]['content'][0]['text']`, so every conversation with a system message was refused ("'str object' has no
attribute 'text'"). For such a template every message's text goes as one text part, as vLLM's "openai" content
format does.
"""

from __future__ import annotations

import re
from typing import Any, Collection

__all__ = ["reads_text_parts", "as_text_parts"]

# `content[0]['text']`, `content'][0]['text']`, `content[0].text`: a template indexing into the parts.
_INDEXES_PARTS = re.compile(r"""content(?:['"]\])?\s*\[\s*0\s*\]\s*(?:\[\s*['"]text['"]\s*\]|\.text)""")


def reads_text_parts(template_sources: Collection[str] | None) -> bool:
    """True for a chat template that indexes into a message's content parts. Raises nothing."""
    return any(_INDEXES_PARTS.search(text) for text in template_sources or ())


def as_text_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each string content as one text part (copies). Raises nothing."""
    return [dict(m, content=[{"type": "text", "text": m["content"]}]) if isinstance(m.get("content"), str) else m
            for m in messages]
