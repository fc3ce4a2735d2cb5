"""A checkpoint's RoPE settings, as mlx-lm's model modules read them, and the context they give.

transformers 5 writes `rope_parameters: {rope_type, factor, ..., rope_theta}` (per layer type for models with
sliding and full attention) and drops the top-level `rope_theta` and `rope_scaling`; most mlx-lm modules (llama, phi3,
gemma3, qwen2, ...) read only those, so a v5 config loaded with theta 10,000 and no scaling, silently.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from engine.errors import ModelUnsupported

__all__ = ["rope_overrides", "scaled_context", "checked_context"]

_log = logging.getLogger(__name__)

# transformers 5's layer-type keys of a nested `rope_parameters`, and the mlx-lm args fields each maps to (theta,
# scaling); a sliding layer's scaling has no field: mlx-lm's sliding layers use plain RoPE.
_LAYER_FIELDS = {"full_attention": ("rope_theta", "rope_scaling"), "sliding_attention": ("rope_local_base_freq", None)}


def rope_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """The config.json fields to add so that the mlx-lm module of `config` reads the RoPE its `rope_parameters` says
    (a nested `text_config` is returned whole, updated); empty when nothing is to add. Never overrides a field the
    config has. Raises ModelUnsupported naming `rope_parameters` for a form that maps to no field the module reads."""
    out = _overrides(config, _args_fields(config))
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("rope_parameters") is not None:
        fields = _args_fields(text) if "model_type" in text else None
        if inner := _overrides(text, fields):
            out["text_config"] = {**text, **inner}
    return out


def _overrides(config: dict[str, Any], fields: set[str] | None) -> dict[str, Any]:
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        return {}
    if fields is not None and "rope_parameters" in fields:
        return {}  # this module reads rope_parameters itself (qwen3, gemma4_text, ministral3, ...)
    nested = {k: v for k, v in params.items() if isinstance(v, dict)}
    if not nested:
        return _flat(config, params)
    unknown = sorted(set(nested) - set(_LAYER_FIELDS))
    if unknown or len(nested) != len(params):
        raise ModelUnsupported(f"config.json's rope_parameters is nested by {', '.join(sorted(params))}: only "
                               "full_attention and sliding_attention map to fields mlx-lm reads")
    out = _flat(config, nested["full_attention"]) if "full_attention" in nested else {}
    sliding = nested.get("sliding_attention")
    if sliding is not None:
        if _rope_type(sliding) != "default":
            raise ModelUnsupported(f"config.json's rope_parameters.sliding_attention asks for {_rope_type(sliding)} "
                                   "RoPE: mlx-lm's sliding-window layers run plain RoPE only")
        theta = sliding.get("rope_theta")
        if fields is not None and "rope_local_base_freq" not in fields:
            # The module runs every layer with rope_theta: only a sliding theta equal to the full one maps.
            full_theta = out.get("rope_theta", config.get("rope_theta"))
            if theta is not None and full_theta is not None and theta != full_theta:
                raise ModelUnsupported("config.json's rope_parameters gives sliding_attention layers a rope_theta of "
                                       f"{theta} and full_attention ones {full_theta}: the mlx-lm "
                                       f"{config.get('model_type')} module has one rope_theta for both")
        elif theta is not None and "rope_local_base_freq" not in config:
            out["rope_local_base_freq"] = theta
    return out


def _flat(config: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "rope_theta" not in config and params.get("rope_theta") is not None:
        out["rope_theta"] = params["rope_theta"]
    if "partial_rotary_factor" not in config and params.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = params["partial_rotary_factor"]
    if config.get("rope_scaling") is None and (kind := _rope_type(params)) != "default":
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
        # Both spellings: initialize_rope reads "type" first, phi3's args read only "type".
        out["rope_scaling"] = {**scaling, "type": kind, "rope_type": kind}
    return out


def _rope_type(params: dict[str, Any]) -> str:
    return str(params.get("rope_type") or params.get("type") or "default")


def _args_fields(config: dict[str, Any]) -> set[str] | None:
    """The fields of the ModelArgs of the mlx-lm module `config` names; None when it names none mlx-lm has."""
    try:
        from mlx_lm.utils import _get_classes

        _, args = _get_classes(config)
        return {f.name for f in dataclasses.fields(args)}
    except Exception:  # no such module, or args that are no dataclass: mlx-lm's own load says so
        return None


def scaled_context(config: dict[str, Any], length: int) -> int:
    """The context `length` (max_position_embeddings) extended by config.json's rope_scaling, by vLLM's rule
    (_get_and_verify_max_len): su/longrope/llama3 already count it; yarn gives original_max_position_embeddings x
    factor, linear and dynamic max_position_embeddings x factor. Raises nothing."""
    scaling = config.get("rope_scaling") or (config.get("text_config") or {}).get("rope_scaling")
    if not isinstance(scaling, dict):
        return length
    kind = _rope_type(scaling)
    factor = scaling.get("factor")
    if kind in ("su", "longrope", "llama3", "default", "mrope") or not isinstance(factor, (int, float)):
        return length
    base = scaling.get("original_max_position_embeddings", length) if kind == "yarn" else length
    return int(base * factor) if isinstance(base, int) and factor > 1 else length


# The module class names mlx-lm gives each rope_scaling type it implements (rope_utils.initialize_rope, and models'
# own: DeepseekV2YarnRotaryEmbedding); "linear" is nn.RoPE with scale 1/factor.
_IMPLEMENTED_BY = {"yarn": ("Yarn",), "deepseek_yarn": ("Yarn",), "dynamic": ("Dynamic",), "llama3": ("Llama3",),
                   "longrope": ("SuScaled", "LongRope"), "su": ("SuScaled", "LongRope")}


def checked_context(model: Any, config: dict[str, Any], length: int) -> int:
    """`length` extended by config.json's rope_scaling (`scaled_context`) once the built `model` is seen to run that
    scaling; unchanged where its rope modules cannot be told apart (RoPE inlined in attention), and where the model runs
    plain RoPE for a scaling that only extends its context (logged once). Raises ModelUnsupported naming rope_scaling
    when the model runs plain RoPE for a scaling it was trained with (mlx-lm's mixtral and qwen3_moe drop any)."""
    import mlx.nn as nn

    scaling = config.get("rope_scaling") or (config.get("text_config") or {}).get("rope_scaling")
    if not isinstance(scaling, dict) or (kind := _rope_type(scaling)) in ("default", "mrope"):
        return length
    ropes = [m for _, m in model.named_modules() if isinstance(m, nn.RoPE) or "RoPE" in type(m).__name__
             or "Rotary" in type(m).__name__]
    if not ropes:
        return length
    if kind == "linear":
        factor = scaling.get("factor")
        runs = isinstance(factor, (int, float)) and any(
            isinstance(m, nn.RoPE) and abs(float(m.scale) - 1 / factor) < 1e-9 for m in ropes)
    elif kind in _IMPLEMENTED_BY:
        runs = any(name in type(m).__name__ for m in ropes for name in _IMPLEMENTED_BY[kind])
    else:
        return length  # a type this check does not know: mlx-lm's initialize_rope refuses the ones it lacks
    if runs:
        return scaled_context(config, length)
    module = f"mlx-lm's {config.get('model_type')} module does not run (it built {type(ropes[0]).__name__})"
    if _extension_only(kind, scaling, length):
        # Qwen3-MoE's card adds yarn past a context trained with plain RoPE: within it plain RoPE is what it learnt.
        _log.warning("config.json's rope_scaling asks for %s RoPE, which %s: served with plain RoPE within its "
                     "max_position_embeddings, %d tokens", kind, module, length)
        return length
    raise ModelUnsupported(f"config.json's rope_scaling asks for {kind} RoPE, which {module}: the model was trained "
                           "with it, so plain RoPE would answer wrongly at every length")


def _extension_only(kind: str, scaling: dict[str, Any], length: int) -> bool:
    """Whether a scaling only extends a context the model learnt with plain RoPE: dynamic NTK always (it is plain RoPE
    within the original length); yarn where max_position_embeddings stays below original x factor (Qwen2.5 / Qwen3's
    cards), unlike a model trained with it (gpt-oss: 4,096 x 32 = 131,072). Raises nothing."""
    if kind == "dynamic":
        return True
    original, factor = scaling.get("original_max_position_embeddings"), scaling.get("factor")
    return kind == "yarn" and isinstance(original, int) and isinstance(factor, (int, float)) \
        and length < original * factor
