"""Which quantizations a checkpoint may carry: what mlx-lm's load turns into MLX quantized layers, refused by name
otherwise, before the model is built (mlx-lm's own errors named a tensor, a bit width of 0, or nothing at all)."""

from __future__ import annotations

from typing import Any

from engine.errors import ModelUnsupported

__all__ = ["check_quantization"]

_SUPPORTED = ("served are MLX quantization (a `quantization` block, as mlx_lm.convert -q writes it: affine, mxfp4, "
              "mxfp8, nvfp4) and AWQ 4-bit, as mlx-lm loads it")
# compressed-tensors formats mlx-lm maps to MLX modes (mlx_lm.utils._compressed_tensors_quantization).
_COMPRESSED = ("nvfp4-pack-quantized", "mxfp4-pack-quantized", "pack-quantized")


def check_quantization(config: dict[str, Any], *, cpu: bool) -> None:
    """Refuse the quantization config.json describes when mlx-lm cannot load it as MLX layers, or (`cpu`) MLX cannot
    run it on the CPU. Raises ModelUnsupported naming the field."""
    if cpu and config.get("quantize_activations"):
        raise ModelUnsupported("config.json's quantize_activations: true (QQLinear, quantized activations) has no "
                               "CPU kernel in MLX ([QQMatmul] NYI): serve it on a GPU, or drop the field")
    qc = config.get("quantization_config")
    if isinstance(config.get("quantization"), dict) or not isinstance(qc, dict):
        return  # MLX's own quantization (mlx_lm.convert writes both blocks, alike), or none
    method = str(qc.get("quant_method") or "").lower()
    if _loads(method, qc, config):
        return
    detail = {"awq": f" with bits {qc.get('bits')}", "compressed-tensors": f" of format {qc.get('format')!r}",
              "fp8": " (block-scaled fp8)"}.get(method, "")
    raise ModelUnsupported(f"config.json's quantization_config.quant_method is {method or 'missing'!r}{detail}, which "
                           f"this server cannot load: {_SUPPORTED}; convert the unquantized weights with "
                           "`mlx_lm.convert -q`")


def _loads(method: str, qc: dict[str, Any], config: dict[str, Any]) -> bool:
    if method == "awq":
        return qc.get("bits", 4) == 4  # mlx-lm unpacks AutoAWQ's 4-bit layout only
    if method in ("mxfp4", "mxfp8", "bitnet"):
        return True
    if method == "modelopt":
        return (qc.get("quantization") or qc).get("quant_algo") == "NVFP4"
    if method == "compressed-tensors":
        return qc.get("format") in _COMPRESSED
    if method == "fp8":
        mxfp8 = qc.get("scale_fmt") == "ue8m0" and list(qc.get("weight_block_size") or ()) == [32, 32]
        return mxfp8 or _sanitizes_fp8(config)
    return False  # gptq (mlx-lm reads its qweight as AWQ's), bitsandbytes, hqq, eetq, aqlm, quanto, torchao, ...


def _sanitizes_fp8(config: dict[str, Any]) -> bool:
    """True when the mlx-lm module of `config` dequantizes fp8 weights itself (deepseek_v3, minimax, ...: its
    sanitize reads `weight_scale_inv`). Raises nothing."""
    import inspect
    import sys

    try:
        from mlx_lm.utils import _get_classes

        model, _ = _get_classes(config)
        return "weight_scale_inv" in inspect.getsource(sys.modules[model.__module__])
    except Exception:  # no such module: mlx-lm's own load says so
        return False
