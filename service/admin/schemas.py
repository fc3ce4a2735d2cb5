"""Pydantic models of the admin routes: the served models (/v1/models), /health and /livez."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

__all__ = ["ModelCard", "ModelList", "AnthropicModel", "AnthropicModelList", "Health", "Liveness"]


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
    # vLLM's ModelCard fields (`vllm bench serve` without --model loads its tokenizer from `root`): where the model
    # comes from (its repo id or folder; the id where nothing else is known), the base model of an adapter listed on
    # its own (none is: a --adapter-path is applied to the served model), the context length requests are held to.
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None

    @model_validator(mode="after")
    def _root_defaults_to_id(self) -> "ModelCard":
        if self.root is None:
            self.root = self.id
        return self


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class AnthropicModel(BaseModel):
    """A model as Anthropic's Models API gives it (the anthropic SDKs' `ModelInfo`)."""

    type: Literal["model"] = "model"
    id: str
    display_name: str
    created_at: str = Field(..., description="RFC 3339: when this server started serving the model.")


class AnthropicModelList(BaseModel):
    """A page of Anthropic's model list: `first_id` is the `before_id` of the page before, `last_id` the `after_id`
    of the page after; `has_more`: more in the direction asked for."""

    data: list[AnthropicModel]
    has_more: bool
    first_id: str | None
    last_id: str | None


class Health(BaseModel):
    status: Literal["ok", "loading", "restarting", "stopping", "failing"]
    model: str | None = None
    # Why the engine cannot run rows: its last step error ("failing"), or that its process restarts.
    error: str | None = Field(None, exclude_if=_omit_none)


class Liveness(BaseModel):
    """/livez: whether the process should be left running (alive) or restarted (failing)."""

    status: Literal["alive", "failing"]
    # Why the engine cannot run rows (failing only).
    error: str | None = Field(None, exclude_if=_omit_none)
