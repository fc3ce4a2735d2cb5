"""What a checkpoint's config.json asks for that mlx-lm would load wrongly or not at all, said before the model is
built: the config fields mlx-lm's module should read (engine/rope_config.py), and quantizations it cannot run.
Reads config.json only: `tandem serve` runs these before it binds the port, `load_model` before it builds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.quant_checks import check_quantization
from engine.rope_config import rope_overrides

__all__ = ["checked_overrides", "read_config"]


def read_config(directory: Path) -> dict[str, Any]:
    """config.json of `directory` as a dict; empty when it does not read (mlx-lm's load says why). Raises nothing."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def checked_overrides(config: dict[str, Any], *, cpu: bool = False) -> dict[str, Any]:
    """The fields to give mlx-lm's load (`model_config`) so the model it builds is the one config.json describes
    (`cpu`: it will run on the CPU backend). Raises ModelUnsupported naming the field of a checkpoint it cannot
    serve."""
    check_quantization(config, cpu=cpu)
    return rope_overrides(config)
