"""`tandem generate` and `tandem transcribe` hold the loading lock while they load, as servers do: a server starting
meanwhile (or `models rm --partial`) must not take their conversion in progress for an interrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.cli.main import main
from service.process.cleanup import remove_interrupted_conversions
from tests.service.cli.conftest import write_wav


def _staged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path]:
    """The user cache, with a conversion's staging folder as one in progress leaves it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "cache" / "mlx-tandem"
    staging = root / "gguf" / ".convert-abc123"
    staging.mkdir(parents=True)
    return root, staging


def test_generate_holds_the_lock_while_it_loads(tiny_llm_dir: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.models

    root, staging = _staged(monkeypatch, tmp_path)
    real, seen = engine.models.load_model, []

    def load(*args: Any, **kwargs: Any) -> Any:
        seen.append(remove_interrupted_conversions(root))  # what a server starting now would remove
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.models, "load_model", load)
    assert main(["generate", "hi", "--model", str(tiny_llm_dir), "--max-tokens", "2"]) == 0
    assert seen == [[]] and staging.is_dir()
    assert remove_interrupted_conversions(root) == [staging]  # once generate has loaded


def test_transcribe_holds_the_lock_while_it_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import audio.speech
    from tests.fixtures.tiny_whisper import build_tiny_whisper

    root, staging = _staged(monkeypatch, tmp_path)
    whisper = build_tiny_whisper(tmp_path / "whisper")
    real, seen = audio.speech.resolve_whisper_checkpoint, []

    def resolve(*args: Any, **kwargs: Any) -> Any:  # where a first use imports a CTranslate2 checkpoint
        seen.append(remove_interrupted_conversions(root))
        return real(*args, **kwargs)

    monkeypatch.setattr(audio.speech, "resolve_whisper_checkpoint", resolve)
    wav = write_wav(tmp_path / "a.wav", np.zeros(16000))
    assert main(["transcribe", str(wav), str(whisper)]) == 0
    assert seen == [[]] and staging.is_dir()
