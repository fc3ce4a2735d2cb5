"""Shared fixtures: the anyio backend and tiny random-init models in real on-disk layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.tiny_llm import build_tiny_llm

__all__ = ["anyio_backend", "tiny_llm_dir"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_llm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama (hidden 64, 2 layers, ByteLevel BPE vocab 400, ChatML template) on disk."""
    return build_tiny_llm(tmp_path_factory.mktemp("tiny_llm"))
