"""Values of Responses fields this server does not offer, refused in a sentence saying what happens instead:
pydantic's "Input should be 'disabled'" said neither."""

from __future__ import annotations

from typing import Any

from service.chat.verbosity import verbosity_validator

__all__ = ["context_management_offered", "truncation_offered", "verbosity_offered"]


def truncation_offered(cls: Any, value: Any) -> Any:
    """A `truncation` validator (before parsing): only "disabled". Raises ValueError."""
    if isinstance(value, str) and value != "disabled":
        raise ValueError(f"{value!r} is not offered: an input longer than the model's context is refused with "
                         "context_length_exceeded, never cut; trim the conversation, or send 'disabled'")
    return value


def context_management_offered(cls: Any, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A `context_management` validator: nothing asked only (VS Code Copilot Chat's Responses requests may ask for
    compaction). Raises ValueError."""
    if value:
        kinds = ", ".join(sorted({repr(entry.get("type")) for entry in value}))
        raise ValueError(f"{kinds} is not offered: nothing is compacted here (an input longer than the model's "
                         "context is refused with context_length_exceeded); leave context_management out")
    return value


# Chat's own check, worded for this route's `instructions`.
verbosity_offered = verbosity_validator("the instructions")
