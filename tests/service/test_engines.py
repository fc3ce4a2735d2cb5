"""service/engines.py: a model directory with a broken file fails to load with one line naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.config import ServiceConfig
from service.engines import ModelFileError, open_engine

pytestmark = pytest.mark.anyio


def _copy(tiny_llm_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_llm_dir, tmp_path / "model"))


async def _load_error(directory: Path) -> str:
    with pytest.raises(ModelFileError) as caught:
        engine = await open_engine(ServiceConfig(model=str(directory)))
        engine.close()
    message = str(caught.value)
    assert "\n" not in message
    return message


async def test_a_config_without_the_model_fields_names_config_json(tiny_llm_dir: Path, tmp_path: Path) -> None:
    # mlx-lm said only "ModelArgs.__init__() missing 5 required positional arguments".
    model = _copy(tiny_llm_dir, tmp_path)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": "abc"}))
    message = await _load_error(model)
    assert f"{model / 'config.json'} does not describe a usable llama model" in message, message


async def test_a_truncated_config_names_config_json(tiny_llm_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_llm_dir, tmp_path)
    (model / "config.json").write_text((model / "config.json").read_text()[:20])
    assert f"{model / 'config.json'} is not valid JSON" in await _load_error(model)


async def test_an_empty_weights_file_is_named(tiny_llm_dir: Path, tmp_path: Path) -> None:
    # mlx said only "[read] Unable to read 8 bytes from file."
    model = _copy(tiny_llm_dir, tmp_path)
    weights = sorted(model.glob("*.safetensors"))[0]
    weights.write_bytes(b"")
    assert f"{weights} is empty (0 bytes)" in await _load_error(model)


async def test_a_truncated_weights_file_is_named(tiny_llm_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_llm_dir, tmp_path)
    weights = sorted(model.glob("*.safetensors"))[0]
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert f"{weights} is truncated" in await _load_error(model)
