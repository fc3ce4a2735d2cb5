"""The sampling fields /v1/responses takes beyond OpenAI's, with chat's meaning: Open WebUI's "Responses"
connection sends its advanced parameters (`seed`, `top_k`, `min_p`, `reasoning_effort`) at the top level, and
vLLM's Responses API takes the penalties there too, and `ignore_eos` (`vllm bench serve --backend openai-responses`
sends it) with `min_tokens` beside it. Each passes to the chat request as chat takes it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from service.chat.schemas import _Body
from service.chat.vllm_fields import no_top_k

__all__ = ["ResponsesSampling", "EFFORTS"]

EFFORTS = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ResponsesSampling(_Body):
    """Chat's sampling fields on a Responses body (service/chat/schemas.py SamplingFields says what each does)."""

    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1, description="As chat's: a seed repeats its draws.")
    top_k: int | None = Field(None, ge=-1, description="As chat's: 0 or -1, no top-k.")
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="As chat's.")
    repetition_penalty: float | None = Field(None, gt=0.0, description="As chat's (mlx_lm.server's).")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="As chat's.")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="As chat's.")
    min_tokens: int | None = Field(None, ge=0, description="As chat's (vLLM's): no end before this many tokens; at "
                                                          "most max_output_tokens.")
    ignore_eos: bool | None = Field(None, description="As chat's (vLLM's): true, the model's end tokens do not end "
                                                      "the reply.")
    reasoning_effort: EFFORTS | None = Field(None, description="Chat's name of `reasoning.effort` (not both).")

    _top_k = field_validator("top_k")(no_top_k)

    def chat_sampling(self) -> dict[str, Any]:
        """The chat request's fields for these (those given). Raises nothing."""
        return {name: value for name in _CHAT_FIELDS if (value := getattr(self, name)) is not None}


# Each field here but the effort (which chat_request resolves against `reasoning.effort`) keeps chat's name.
_CHAT_FIELDS = tuple(name for name in ResponsesSampling.model_fields if name != "reasoning_effort")
