"""`tandem models ls` lists the GGUF conversions (with their source) and what interrupted imports left; `tandem
models rm NAME|--partial` removes what tandem made, never the Hugging Face cache or the user's folders."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from engine.cache_entries import EntrySource, record_source
from service.cli.main import main
from tests.engine.test_models import hub_cache, put_in_hub_cache  # noqa: F401  (fixture)
from tests.fixtures.tiny_whisper import build_tiny_whisper

CONVERSION = "model.Q4_0-0123456789abcdef"
KEY = "fedcba9876543210"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def cache(hub_cache: Path, tmp_path: Path) -> Path:  # noqa: F811
    """tandem's cache (XDG_CACHE_HOME, as hub_cache sets it) with one conversion, one Whisper import, and an
    interrupted conversion, import and safetensors write."""
    root = tmp_path / "xdg" / "mlx-tandem"
    source = tmp_path / "model.Q4_0.gguf"
    source.write_bytes(b"GGUF")
    conversion = root / "gguf" / CONVERSION
    conversion.mkdir(parents=True)
    (conversion / "config.json").write_text("{}")
    (conversion / "model.safetensors").write_bytes(b"\0" * 300_000)
    record_source(conversion, EntrySource(str(source), "0123456789abcdef", (2,)))
    (root / "gguf" / ".convert-x1y2").mkdir()
    (root / "gguf" / ".convert-x1y2" / "model.safetensors").write_bytes(b"\0" * 200_000)
    whisper = build_tiny_whisper(root / "whisper" / KEY / "mine-float32")
    (whisper / ".tmpAbC123").write_bytes(b"\0" * 400_000)
    (root / "whisper" / f"{KEY}-mine-float32.q9.partial").mkdir()
    return root


def _rows(out: str) -> dict[str, str]:
    return {line.split()[0]: line for line in out.splitlines() if line.strip()}


def test_ls_lists_conversions_with_their_source_and_leftovers_with_their_size(
        cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "ls"]) == 0
    rows = _rows(capsys.readouterr().out)
    conversion = rows[CONVERSION]
    assert "(converted)" in conversion and "llm" in conversion and "0.3 MB" in conversion
    assert conversion.endswith(f"from {tmp_path / 'model.Q4_0.gguf'}"), conversion
    leftovers = {".convert-x1y2": "0.2 MB", ".tmpAbC123": "0.4 MB", f"{KEY}-mine-float32.q9.partial": "0.0 MB"}
    for name, size in leftovers.items():
        assert size in rows[name] and "partial (interrupted import)" in rows[name], rows[name]
    # the import's own size leaves out the .tmp file listed apart (it was counted in both rows)
    whisper = cache / "whisper" / KEY / "mine-float32"
    own = sum(f.stat().st_size for f in whisper.rglob("*") if f.is_file() and not f.name.startswith(".tmp"))
    assert f"{own / 1e6:.1f} MB" in rows["mine-float32"], rows["mine-float32"]


def test_rm_removes_a_conversion_and_says_what_it_freed(cache: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "rm", CONVERSION, "--yes"]) == 0
    out = capsys.readouterr().out
    assert not (cache / "gguf" / CONVERSION).exists()
    assert (tmp_path / "model.Q4_0.gguf").exists()  # the source stays
    assert f"removed {CONVERSION}" in out and "freed 0.3 MB" in out, out
    # a Whisper import, by the name `models ls` shows (its note too), and its key folder once empty
    assert main(["models", "rm", "mine-float32 (imported)", "--yes"]) == 0
    assert not (cache / "whisper" / KEY).exists()


def test_rm_asks_on_a_terminal_and_refuses_without_one(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    conversion = cache / "gguf" / CONVERSION
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # not a terminal: no answer is read from it
    assert main(["models", "rm", CONVERSION]) == 2
    assert "--yes" in capsys.readouterr().err and conversion.exists()
    monkeypatch.setattr(sys, "stdin", _Terminal("n\n"))
    assert main(["models", "rm", CONVERSION]) == 1
    assert "remove model.Q4_0" in capsys.readouterr().err and conversion.exists()
    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    assert main(["models", "rm", CONVERSION]) == 0
    assert not conversion.exists()


def test_rm_never_touches_the_hf_cache_or_the_users_folders(cache: Path, hub_cache: Path,  # noqa: F811
                                                            tiny_llm_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = put_in_hub_cache(hub_cache, "org/chat", tiny_llm_dir)
    assert main(["models", "rm", "org/chat", "--yes"]) == 2
    assert "Hugging Face cache" in capsys.readouterr().err and snapshot.exists()
    assert main(["models", "rm", str(tiny_llm_dir), "--yes"]) == 2
    assert "not a conversion or import of tandem's" in capsys.readouterr().err
    assert (tiny_llm_dir / "config.json").exists()
    assert main(["models", "rm", "no-such-model", "--yes"]) == 2
    assert "tandem models ls" in capsys.readouterr().err


def test_rm_partial_removes_only_the_leftovers(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "rm", "--partial", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "freed 0.6 MB" in out, out
    assert not (cache / "gguf" / ".convert-x1y2").exists()
    assert not list(cache.rglob(".tmp*")) and not list((cache / "whisper").glob("*.partial"))
    assert (cache / "gguf" / CONVERSION / "model.safetensors").exists()
    assert (cache / "whisper" / KEY / "mine-float32" / "weights.safetensors").exists()
    assert main(["models", "rm", "--partial", "--yes"]) == 0
    assert "nothing left" in capsys.readouterr().err


def test_rm_waits_for_no_server_loading(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a server holds the lock shared while it loads (and may convert): its staging folder is no leftover yet
    from service.process.cleanup import loading_models

    with loading_models(cache):
        assert main(["models", "rm", "--partial", "--yes"]) == 1
    assert "a server is loading models now" in capsys.readouterr().err
    assert (cache / "gguf" / ".convert-x1y2").exists()
