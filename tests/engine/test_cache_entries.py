"""engine/cache_entries.py: which cache entries a new one supersedes, and removals that fail leave the start alone."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engine.cache_entries import EntrySource, prune_superseded, read_source, record_source


def _entry(root: Path, name: str, source: EntrySource | None) -> Path:
    entry = root / name
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{}")
    if source is not None:
        record_source(entry, source)
    return entry


def _prune(root: Path, written: Path, source: EntrySource) -> list[Path]:
    candidates = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    return prune_superseded(candidates, written, source, staging_root=root, staging_prefix=".convert-")


def test_a_sidecar_reads_back(tmp_path: Path) -> None:
    source = EntrySource(str(tmp_path / "m.gguf"), "ab" * 8, (2, 1), {"size": 3})
    assert read_source(_entry(tmp_path, "m", source)) == source
    assert read_source(_entry(tmp_path, "legacy", None)) is None


def test_only_superseded_entries_go(tmp_path: Path) -> None:
    root, models = tmp_path / "cache", tmp_path / "models"
    models.mkdir()
    here, beside = models / "m.gguf", models / "copy.gguf"
    here.write_bytes(b"m")
    beside.write_bytes(b"m")
    written = EntrySource(str(here), "new", (2,))
    kept = [
        _entry(root, "m-new", written),  # the entry just written
        _entry(root, "m-new-f32", written),  # its sibling of the same key (another dtype)
        _entry(root, "copy-1", EntrySource(str(beside), "1", (2,))),  # another install's, its source still there
        _entry(root, "m-newer", EntrySource(str(here), "newer", (3,))),  # a newer version's: its own
        _entry(root, "legacy", None),  # written before sidecars: its source unknown
    ]
    gone = [
        _entry(root, "m-old", EntrySource(str(here), "old", (2,))),  # the same file, before it changed
        _entry(root, "m-v1", EntrySource(str(here), "v1", (1,))),  # the same file read by an older format
        _entry(root, "deleted-1", EntrySource(str(models / "deleted.gguf"), "1", (9,))),  # its source is gone
    ]
    assert sorted(_prune(root, kept[0], written)) == sorted(gone)
    assert all(p.is_dir() for p in kept) and not any(p.exists() for p in gone)
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in kept)  # no staging left behind


def test_the_entry_just_written_stays_even_when_its_source_is_gone(tmp_path: Path) -> None:
    source = EntrySource(str(tmp_path / "deleted.gguf"), "k", (2,))
    written = _entry(tmp_path / "cache", "m-k", source)
    assert _prune(tmp_path / "cache", written, source) == [] and written.is_dir()


def test_a_removal_that_fails_is_logged_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cache"
    written = _entry(root, "m-new", EntrySource(str(tmp_path), "new", (2,)))
    stuck = _entry(root, "a-1", EntrySource(str(tmp_path / "a.gguf"), "1", (2,)))
    orphan = _entry(root, "b-1", EntrySource(str(tmp_path / "b.gguf"), "1", (2,)))
    real_rename = Path.rename

    def rename(self: Path, target: Path) -> Path:
        if self == stuck:
            raise PermissionError(13, "Permission denied")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with caplog.at_level(logging.WARNING, logger="engine.cache_entries"):
        assert _prune(root, written, EntrySource(str(tmp_path), "new", (2,))) == [orphan]
    assert stuck.is_dir() and not orphan.exists()
    assert f"could not remove {stuck}" in caplog.text
    assert sorted(p.name for p in root.iterdir()) == ["a-1", "m-new"]  # the failed one's staging folder went too
