"""audio/whisper.py: checkpoint resolution, the real loader, and the residency policy as loop tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audio.whisper import (
    WhisperCheckpointError,
    WhisperResidency,
    is_whisper_checkpoint,
    load_whisper,
    resolve_whisper_checkpoint,
)
from audio.errors import WhisperUnreadableError
from tests.audio.conftest import running_tasks
from tests.fixtures.file_access import make_unreadable
from tests.fixtures.tiny_whisper import build_tiny_whisper


def test_tiny_checkpoint_loads_and_casts(tiny_whisper_dir: Path) -> None:
    import mlx.core as mx

    assert is_whisper_checkpoint(tiny_whisper_dir)
    loaded = load_whisper(tiny_whisper_dir, dtype="float16")
    assert loaded.fp16 and loaded.model.decoder.token_embedding.weight.dtype == mx.float16
    assert load_whisper(tiny_whisper_dir, dtype="float32").model.encoder.conv1.weight.dtype == mx.float32


def test_resolve_accepts_a_dir_and_rejects_others(tiny_whisper_dir: Path, tmp_path: Path) -> None:
    assert resolve_whisper_checkpoint(str(tiny_whisper_dir)) == tiny_whisper_dir
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(WhisperCheckpointError, match="not a Whisper checkpoint"):
        resolve_whisper_checkpoint(str(tmp_path))
    with pytest.raises(WhisperCheckpointError, match="not found"):
        resolve_whisper_checkpoint("no-such-model")
    with pytest.raises(WhisperCheckpointError, match="Hugging Face cache"):
        resolve_whisper_checkpoint("nobody/not-a-cached-repo-xyz")


def test_mismatched_weights_are_a_checkpoint_error(tiny_whisper_dir: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_whisper_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_text_state": 48}))
    (tmp_path / "weights.safetensors").write_bytes((tiny_whisper_dir / "weights.safetensors").read_bytes())
    with pytest.raises(WhisperCheckpointError):
        load_whisper(tmp_path)


@pytest.mark.parametrize("file", ["weights.safetensors", "config.json"])
def test_a_file_this_process_cannot_read_is_named_where_the_model_resolves_and_loads(
        file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache that root wrote at an image's build (weights 0600): the server started, then each load failed in mx.load,
    a 500 `[load_safetensors] Failed to open file`."""
    checkpoint = build_tiny_whisper(tmp_path / "whisper")
    assert resolve_whisper_checkpoint(str(checkpoint)) == checkpoint
    make_unreadable(checkpoint / file, monkeypatch)
    for call in (lambda: resolve_whisper_checkpoint(str(checkpoint)), lambda: load_whisper(checkpoint)):
        with pytest.raises(WhisperUnreadableError, match=f"PermissionError: .*{file}"):
            call()


@pytest.mark.anyio
async def test_idle_zero_unloads_after_each_take_as_a_task(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        r = WhisperResidency(tiny_whisper_dir, tasks, idle_unload_sec=0)
        first = await r.take()
        second = await r.take()  # overlapping take: same model, no reload
        assert first is second and r.loads == 1
        r.release()
        assert r.loaded is not None and "whisper.unload" not in tasks.labels()
        r.release()
        assert tasks.labels() == ["whisper.unload"]  # queued, runs between iterations
        await tasks.run(lambda: None, label="barrier")
        assert r.loaded is None and r.unloads == 1
        await r.take()
        assert r.loads == 2
        r.release()


@pytest.mark.anyio
async def test_a_take_after_a_queued_unload_keeps_the_model(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        r = WhisperResidency(tiny_whisper_dir, tasks, idle_unload_sec=0)
        await r.take()
        r.release()  # unload queued …
        loaded = await r.take()  # … but this take runs after it and reloads, or the unload sees takes > 0
        assert loaded is r.loaded is not None
        r.release()


@pytest.mark.anyio
async def test_resident_and_idle_deadline(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        resident = WhisperResidency(tiny_whisper_dir, tasks, resident=True)
        await resident.take()
        resident.release()
        assert resident.idle_deadline() is None and tasks.labels() == []
        timed = WhisperResidency(tiny_whisper_dir, tasks, idle_unload_sec=60)
        await timed.take()
        timed.release()
        due = timed.idle_deadline()
        assert due is not None
        assert not timed.unload_if_due(due - 1)
        assert timed.unload_if_due(due + 1)
        await tasks.run(lambda: None, label="barrier")
        assert timed.loaded is None


@pytest.mark.anyio
async def test_a_failed_load_releases_the_take(tmp_path: Path, tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        r = WhisperResidency(tmp_path, tasks)
        with pytest.raises(WhisperCheckpointError):
            await r.take()
        assert r.takes == 0
