"""OpenAI's `verbosity` (chat's field, the Responses API's `text.verbosity`): only "medium", its default, is
offered; another is refused in a sentence saying what happens instead (pydantic's "Input should be 'medium'" did
not)."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["verbosity_validator"]


def verbosity_validator(brevity_where: str) -> Callable[[Any, Any], Any]:
    """A `verbosity` validator (before parsing) whose refusal tells where to ask for brevity instead."""

    def offered(cls: Any, value: Any) -> Any:
        """Only "medium" (or null). Raises ValueError."""
        if isinstance(value, str) and value != "medium":
            raise ValueError(f"{value!r} is not offered: replies are as long as the model makes them (ask for "
                             f"brevity in {brevity_where}), or send 'medium'")
        return value

    return offered
