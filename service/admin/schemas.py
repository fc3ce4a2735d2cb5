"""Pydantic models of the admin routes: the served models (/v1/models) and /health."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["ModelCard", "ModelList", "Health"]


def _omit_none(value: Any) -> bool:
    return value is None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "mlx-tandem"
    # What the model does here: "chat" or "transcription".
    kind: str | None = Field(None, exclude_if=_omit_none)
    context_length: int | None = Field(None, exclude_if=_omit_none)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "loading", "restarting", "stopping", "failing"]
    model: str | None = None
    # Why the engine cannot run rows: its last step error ("failing"), or that its process restarts.
    error: str | None = Field(None, exclude_if=_omit_none)
