"""A chat message's content parts (text, an echoed refusal), the prompt-caching marks clients put on parts and messages,
and the part types a text model cannot read, refused with a sentence naming them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag

from service.chat.strict_body import _Request

__all__ = ["CacheControl", "CACHE_BREAKPOINT", "TextPart", "RefusalPart", "ContentPart", "UNREAD_PARTS",
           "unread_parts_refused"]


class CacheControl(_Request):
    """Anthropic-style prompt-caching breakpoint (LiteLLM and OpenRouter clients send it on parts and messages):
    honoured as it is asked — prefixes are kept in the prefix cache whatever the request says."""

    type: Literal["ephemeral"]
    ttl: str | None = None


# LiteLLM's own breakpoint flag (CrewAI's litellm path marks messages with it): honoured as `cache_control` is, the
# prefix cache keeping every prompt's prefix whatever is marked.
CACHE_BREAKPOINT = "A prompt-caching breakpoint (LiteLLM's): accepted, prefixes are cached anyway."


class TextPart(_Request):
    """A text content part; other part types (images, audio) are not served by a text model."""

    type: Literal["text", "input_text"]
    text: str
    cache_control: CacheControl | None = None
    cache_breakpoint: bool | None = Field(None, description=CACHE_BREAKPOINT)


class RefusalPart(_Request):
    """A refusal part of an earlier assistant message (the SDK echoes them back): its text goes to the prompt."""

    type: Literal["refusal"]
    refusal: str


def _part_kind(part: Any) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    if kind is None and isinstance(part, dict):
        return "TextPart"  # which then names the missing `type`
    return {"text": "TextPart", "input_text": "TextPart", "refusal": "RefusalPart"}.get(str(kind))


# Picked by `type`, so an error names the part's own field, not another part type's (the tags are stripped from
# error paths: service/http/handlers.py).
ContentPart = Annotated[
    Union[Annotated[TextPart, Tag("TextPart")], Annotated[RefusalPart, Tag("RefusalPart")]],
    Discriminator(_part_kind, custom_error_type="invalid_part_type",
                  custom_error_message="a content part's type must be 'text' (or 'input_text', 'refusal')"),
]

# Part types a text model cannot read: refused with a sentence naming them (not pydantic's union listing).
UNREAD_PARTS = {"image_url": "images", "input_image": "images", "input_audio": "audio", "file": "files",
                "input_file": "files"}


def unread_parts_refused(content: Any, kinds: dict[str, str] = UNREAD_PARTS, noun: str = "content parts") -> Any:
    """A content validator (before parsing): `noun` of `kinds` a text model cannot read refused. Raises ValueError."""
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in kinds:
            raise ValueError(f"{kind!r} {noun} are not supported: this server's model reads text only, "
                             f"not {kinds[kind]}")
    return content
