"""engine.quant_checks: a quantization mlx-lm cannot load as MLX layers, or MLX cannot run on this backend, is refused
before the model is built, in one line naming quantization_config.quant_method (or the field at fault)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.errors import ModelUnsupported
from engine.models import load_model
from engine.quant_checks import check_quantization
from tests.fixtures.quantized_llm import quantize_tiny_llm


@pytest.mark.parametrize("quantization_config", [
    {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
    {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    {"quant_method": "compressed-tensors", "format": "float-quantized"},
    {"quant_method": "awq", "bits": 8, "group_size": 128},
])
def test_a_quantization_mlx_lm_cannot_load_is_refused_by_its_quant_method(tiny_llm_dir: Path, tmp_path: Path,
                                                                        quantization_config: dict) -> None:
    # mlx-lm named a tensor ("Received 14 parameters not in model: ...SCB"), a bit width of 0, or a g_idx; the server
    # wrapped each as "config.json does not describe a usable llama model".
    model = Path(shutil.copytree(tiny_llm_dir, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    with pytest.raises(ModelUnsupported) as caught:
        load_model(str(model))
    message = str(caught.value)
    method = quantization_config["quant_method"]
    assert f"quantization_config.quant_method is {method!r}" in message and "MLX quantization" in message, message
    assert "AWQ 4-bit" in message and "\n" not in message


def test_what_mlx_lm_loads_passes() -> None:
    check_quantization({"quantization": {"group_size": 64, "bits": 4}}, cpu=True)
    check_quantization({"quantization_config": {"quant_method": "awq", "bits": 4}}, cpu=True)
    check_quantization({"quantization_config": {"quant_method": "mxfp4"}}, cpu=True)
    check_quantization({"quantization_config": {"quant_method": "compressed-tensors",
                                                "format": "pack-quantized"}}, cpu=True)


def test_quantized_activations_are_refused_on_the_cpu(tiny_llm_dir: Path, tmp_path: Path) -> None:
    # nvfp4 with quantize_activations (QQLinear) loaded as ready, then every request was a 500 "[QQMatmul] NYI".
    model = quantize_tiny_llm(tiny_llm_dir, tmp_path / "q4")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "quantize_activations": True}))
    with pytest.raises(ModelUnsupported, match="quantize_activations"):
        load_model(str(model), float32=False)
    check_quantization({**config, "quantize_activations": True}, cpu=False)  # a GPU runs them
