"""Shared fixtures: the anyio backend and tiny random-init models in real on-disk layouts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from engine.accelerator import SERVING_DEFAULTS
from engine.backend import ensure_fast_blas

# On CUDA MLX runs float32 matmuls in TF32 (about 1e-3 relative) unless told not to: the parity tests compare
# our packed forwards with mlx-lm's at 1e-4, a check of the batching, not of TF32's rounding. Read once by MLX.
os.environ.setdefault("MLX_ENABLE_TF32", "0")
# MLX reads its CUDA settings once, when it first touches the device (in a test process, long before an Engine
# applies them): set the server's here, so the tests on a GPU run MLX as `tandem serve` does (CUDA graphs off).
for _name, _value in SERVING_DEFAULTS.items():
    os.environ.setdefault(_name, _value)

ensure_fast_blas()  # the fast CPU BLAS must be loaded before any test module imports mlx

from tests.fixtures.tiny_llm import TinyLoaded, build_tiny_llm, load_tiny_llm

__all__ = ["anyio_backend", "tiny_llm_dir", "tiny_loaded", "hermes_tokenizer", "granite_tokenizer"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_llm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama (hidden 64, 2 layers, ByteLevel BPE vocab 400, ChatML template) on disk."""
    return build_tiny_llm(tmp_path_factory.mktemp("tiny_llm"))


@pytest.fixture(scope="session")
def tiny_loaded(tiny_llm_dir: Path) -> TinyLoaded:
    """The tiny llama loaded through mlx_lm.utils.load, with LoadedModel's fields (context 2048)."""
    return load_tiny_llm(tiny_llm_dir)


@pytest.fixture(scope="session")
def hermes_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny checkpoint's tokenizer with Hermes' named templates (tests/fixtures/family_templates.py)."""
    from tests.fixtures.family_templates import build_hermes

    return build_hermes(tmp_path_factory.mktemp("hermes"))


@pytest.fixture(scope="session")
def granite_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny checkpoint's tokenizer with a template in Granite 3.x's shape."""
    from tests.fixtures.family_templates import build_granite

    return build_granite(tmp_path_factory.mktemp("granite"))
