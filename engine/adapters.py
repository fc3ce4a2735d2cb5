"""Fine-tuned adapters as mlx-lm's trainer writes them (`mlx_lm.lora`: adapter_config.json + adapters.safetensors).

mlx-lm wraps the base model's layers in LoRA/DoRA layers and loads the adapter's weights into them. On a plain
(float) base every wrapped layer is then fused into its weight, as `mlx_lm.fuse` does: the model is a plain one
again, so the packed pass and the fused kernels serve it at the base's speed. On a quantized base the LoRA layers
stay live (what mlx_lm.server serves): fusing would quantize the small update away with the weight it joins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import EngineError

if TYPE_CHECKING:
    import mlx.nn as nn

__all__ = ["AdapterError", "AppliedAdapter", "apply_adapter", "check_adapter_dir"]

_CONFIG = "adapter_config.json"
_WEIGHTS = "adapters.safetensors"


class AdapterError(EngineError, ValueError):
    """An adapter directory that cannot be applied; the message names the directory and what is wrong."""


@dataclass(frozen=True)
class AppliedAdapter:
    """What applying an adapter did: its directory, its kind (lora, dora, full) and the layers it touched."""

    path: str
    kind: str
    fused: int
    live: int

    def describe(self) -> str:
        """One line for the log. Raises nothing."""
        if self.kind == "full":
            return f"adapter {self.path}: full fine-tune weights loaded"
        parts = [f"{self.fused} layers fused into the weights"] if self.fused else []
        if self.live:
            parts.append(f"{self.live} kept as {self.kind} layers (a quantized base)")
        return f"adapter {self.path} ({self.kind}): " + ", ".join(parts or ["no layers"])


def check_adapter_dir(path: str | Path) -> dict[str, Any]:
    """The adapter's config, after checking the directory holds what mlx-lm's trainer writes. Raises AdapterError
    naming the missing or unreadable file (mlx-lm's loader said only "No such file" or a KeyError)."""
    directory = Path(path)
    if not directory.is_dir():
        raise AdapterError(f"adapter path {directory} is not a directory (give the folder `mlx_lm.lora "
                           f"--adapter-path` wrote)")
    missing = [name for name in (_CONFIG, _WEIGHTS) if not (directory / name).is_file()]
    if missing:
        raise AdapterError(f"adapter path {directory} has no {' or '.join(missing)} (mlx-lm's trainer writes "
                           f"{_CONFIG} and {_WEIGHTS}; a PEFT adapter must be converted or fused first)")
    try:
        config = json.loads((directory / _CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{directory / _CONFIG} is not readable JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{directory / _CONFIG} is not a JSON object")
    kind = config.get("fine_tune_type", "lora")
    if kind not in ("lora", "dora", "full"):
        raise AdapterError(f"{directory / _CONFIG}: fine_tune_type {kind!r} is not lora, dora or full")
    if kind != "full":
        needed = [key for key in ("num_layers", "lora_parameters") if key not in config]
        if needed:
            raise AdapterError(f"{directory / _CONFIG} lacks {', '.join(needed)} (written by an older mlx-lm? "
                               f"`lora_layers` is now `num_layers`)")
    return config


def apply_adapter(model: nn.Module, path: str | Path, config: dict[str, Any] | None = None) -> AppliedAdapter:
    """Load the adapter at `path` into `model` (in place) and fuse what can be fused; the model is left in eval
    mode (a live LoRA layer's dropout off). `config`: what check_adapter_dir read (None: read here). Run on the
    thread that will run the model. Raises AdapterError for a directory that is not an adapter or does not fit the
    model."""
    from mlx.utils import tree_unflatten
    from mlx_lm.tuner.utils import load_adapters

    config = check_adapter_dir(path) if config is None else config
    kind = str(config.get("fine_tune_type", "lora"))
    try:
        load_adapters(model, str(path))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # mlx-lm lists each tensor that does not fit; a model family it has no LoRA keys for is a ValueError too.
        raise AdapterError(f"adapter {path} does not fit this model: {exc}") from None
    fused: list[tuple[str, Any]] = []
    live = 0
    for name, module in model.named_modules():
        if not hasattr(module, "fuse"):
            continue
        base = getattr(module, "linear", None)
        base = getattr(module, "embedding", None) if base is None else base
        if base is not None and "Quantized" in type(base).__name__:
            live += 1
        else:
            fused.append((name, module.fuse(dequantize=False)))
    if fused:
        model.update_modules(tree_unflatten(fused))
    model.eval()
    return AppliedAdapter(path=str(path), kind=kind, fused=len(fused), live=live)
