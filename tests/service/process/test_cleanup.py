"""Interrupted conversions are removed at the next start, unless some server is loading models now."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from service.process.cleanup import loading_models, remove_interrupted_conversions


def _leftovers(root: Path) -> list[Path]:
    gguf = root / "gguf" / ".convert-abc123"
    whisper = root / "whisper" / "tiny.en-float32.partial"
    done = root / "gguf" / "model-0123-f32"
    for folder in (gguf, whisper, done):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    return [gguf, whisper, done]


def test_interrupted_conversions_are_removed_and_finished_ones_kept(tmp_path: Path) -> None:
    gguf, whisper, done = _leftovers(tmp_path)
    assert sorted(remove_interrupted_conversions(tmp_path)) == sorted([gguf, whisper])
    assert not gguf.exists() and not whisper.exists() and done.is_dir()


def test_nothing_is_removed_while_another_server_loads(tmp_path: Path) -> None:
    gguf, whisper, _ = _leftovers(tmp_path)
    # Another process holding the loading lock (the lock is per open file, so it must be another one).
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path;"
         "from service.process.cleanup import loading_models\n"
         f"with loading_models(Path({str(tmp_path)!r})):\n print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[3],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert remove_interrupted_conversions(tmp_path) == []
        assert gguf.exists() and whisper.exists()
    finally:
        holder.communicate("")
    assert len(remove_interrupted_conversions(tmp_path)) == 2  # once the loader is done


def test_loading_models_works_without_a_writable_cache(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with loading_models(blocked / "cache"):
        pass
