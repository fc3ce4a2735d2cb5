"""Values of Responses fields this server does not offer, refused in a sentence saying what happens instead:
pydantic's "Input should be 'disabled'" said neither."""

from __future__ import annotations

from typing import Any

__all__ = ["truncation_offered", "verbosity_offered"]


def truncation_offered(cls: Any, value: Any) -> Any:
    """A `truncation` validator (before parsing): only "disabled". Raises ValueError."""
    if isinstance(value, str) and value != "disabled":
        raise ValueError(f"{value!r} is not offered: an input longer than the model's context is refused with "
                         "context_length_exceeded, never cut; trim the conversation, or send 'disabled'")
    return value


def verbosity_offered(cls: Any, value: Any) -> Any:
    """A `text.verbosity` validator (before parsing): only "medium". Raises ValueError."""
    if isinstance(value, str) and value != "medium":
        raise ValueError(f"{value!r} is not offered: replies are as long as the model makes them (ask for "
                         "brevity in the instructions), or send 'medium'")
    return value
