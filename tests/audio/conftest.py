"""Audio fixtures: a tiny random-init Whisper on disk (and loaded), a running tasks-only driver loop, and a
speech-like test signal."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator

import anyio
import numpy as np
import pytest

from audio.whisper import LoadedWhisper, load_whisper
from engine.context import EngineThread
from engine.driver import drive_execution_group
from engine.task_group import TasksOnlyGroup
from engine.tasks import ExecutionTasks
from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS, build_tiny_whisper

__all__ = ["tiny_whisper_dir", "tiny_whisper", "multilingual_whisper", "whisper_cache", "running_tasks", "voiced", "SR"]

SR = 16000


@pytest.fixture(scope="session")
def tiny_whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


@pytest.fixture
def whisper_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user cache of this test's own (where CTranslate2 imports go), and no demo checkpoint installed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("audio.whisper._demo_ct2_dir", lambda: None)
    return tmp_path / "xdg" / "mlx-tandem" / "whisper"


@pytest.fixture(scope="session")
def tiny_whisper(tiny_whisper_dir: Path) -> LoadedWhisper:
    """The tiny Whisper loaded in float32 (load_whisper is engine-thread work; tests call it directly)."""
    return load_whisper(tiny_whisper_dir, dtype="float32")


@pytest.fixture(scope="session")
def multilingual_whisper(tmp_path_factory: pytest.TempPathFactory) -> LoadedWhisper:
    """The tiny Whisper with a multilingual vocabulary (99 language tokens), so windows detect their language."""
    dims = {**TINY_WHISPER_DIMS, "n_vocab": 51865}
    return load_whisper(build_tiny_whisper(tmp_path_factory.mktemp("multilingual_whisper"), dims), dtype="float32")


@contextlib.asynccontextmanager
async def running_tasks() -> AsyncIterator[ExecutionTasks]:
    """ExecutionTasks driven by the real loop (engine thread + TasksOnlyGroup) until the block ends."""
    group, thread = TasksOnlyGroup(), EngineThread("test-engine")
    async with anyio.create_task_group() as tg:
        tg.start_soon(drive_execution_group, group, anyio.Lock(), thread)
        try:
            yield group.tasks
        finally:
            group.close()
    thread.close()


def voiced(seconds: float, f0: float = 150.0) -> np.ndarray:
    """An amplitude-modulated sawtooth: webrtcvad calls it speech; Whisper does not care."""
    t = np.arange(int(seconds * SR)) / SR
    saw = ((t * f0) % 1.0 - 0.5) * 0.5
    return (saw * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
