"""The bases of request bodies: every field a request carries is honoured or refused with a 400 naming it.

`_Body` refuses unknown top-level fields (service/http/handlers.py words it as OpenAI does); `_Request`, a nested
object, lets unknown fields pass only while they are empty (the SDK's own message objects echo `refusal: null`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["_Body", "_Request", "_empty", "_only_false"]


def _only_false(value: bool | None, why: str) -> bool | None:
    """A switch whose `true` this server cannot honour. Raises ValueError saying `why`."""
    if value:
        raise ValueError(why)
    return value


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


class _Request(BaseModel):
    """A nested object of a request: unknown fields pass only while empty (nothing there to honour). Strict, as
    OpenAI's: `"5"` is not a number, `true` not a count, `1` not a flag (lax parsing streamed for `stream: "yes"`)."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="after")
    def _no_unhonoured_extras(self) -> "_Request":
        for key, value in (self.model_extra or {}).items():
            if not _empty(value):
                raise ValueError(f"{key!r} is not supported by this server")
        return self


class _Body(_Request):
    """A request body: unknown top-level fields are refused (service/http/handlers.py words it as OpenAI does)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def model_validate(cls, obj: Any, *, strict: bool | None = None, **kwargs: Any) -> Any:
        """Strict whatever the caller asks: Litestar validates request bodies with `strict=False`, which
        overrides the models' own configuration."""
        return super().model_validate(obj, strict=True, **kwargs)
