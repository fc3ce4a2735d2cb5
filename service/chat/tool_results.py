"""What a tool returned that a text model cannot read (an image, a file, audio): told to the model in a line.

Agents' tools return pictures (a screenshot in Cline or Roo, Zed's tool results, Codex's view_image); refusing one
would stop the session, whose history carries it every turn. A user's own image stays refused: it asks the model
something it cannot see.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RETURNED", "returned_parts_said", "tool_message_content"]

# Part types (chat's and /v1/responses') a tool may return that a text model cannot read, as the line names them.
RETURNED = {"image_url": "an image", "input_image": "an image", "input_audio": "audio", "file": "a file",
            "input_file": "a file"}


def returned_parts_said(content: Any, text_type: str = "text") -> Any:
    """A tool result's content (before parsing) with each unreadable part as a `text_type` part saying what it was.
    Raises nothing."""
    if not isinstance(content, list):
        return content
    return [{"type": text_type, "text": f"[the tool returned {RETURNED[p['type']]}: this model reads text only]"}
            if isinstance(p, dict) and p.get("type") in RETURNED else p for p in content]


def tool_message_content(content: Any) -> Any:
    """A chat tool message's content (before parsing): unreadable parts said in a line, and an empty list an empty
    result — Zed sends [] for a tool that returned nothing, and vLLM reads it as "" (other roles' [] stays refused,
    as OpenAI refuses it). Raises nothing."""
    return "" if content == [] else returned_parts_said(content)
