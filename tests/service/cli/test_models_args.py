"""`tandem models get` checks the repo id and that the hub answers before downloading; `models import`
leaves a non-empty OUTPUT alone unless --force, never writes over or beside its source, and writes its files with
the usual modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli.main import main
from tests.fixtures.file_access import tree_modes, umask


@pytest.fixture
def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.hub

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing may be downloaded")

    monkeypatch.setattr(engine.hub, "download_model", fail)


@pytest.mark.parametrize("repo, words", [("", "give a repo id"), ("  ", "give a repo id"),
                                         ("a b/c", "not a repo id"), ("a/b/c", "not a repo id")])
def test_text_that_is_no_repo_id_is_a_usage_error(repo: str, words: str, no_download: None,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "get", repo]) == 2
    err = capsys.readouterr().err
    assert words in err and "not found" not in err, err


def test_an_unreachable_hub_is_one_quick_line(no_download: None, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:1")  # nothing listens there
    assert main(["models", "get", "org/name/file.gguf"]) == 1
    assert "could not reach the Hugging Face hub" in capsys.readouterr().err


def _fake_import(src: Path, dst: Path, dtype: str = "float32") -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text("{}")
    (dst / "weights.safetensors").write_bytes(b"x")
    return dst


def test_import_refuses_a_dir_that_is_not_empty_without_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import audio.ctranslate2_import

    monkeypatch.setattr(audio.ctranslate2_import, "import_ct2_whisper", _fake_import)
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "model.bin").write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert main(["models", "import", str(tmp_path / "ct2"), str(out)]) == 2
    assert "--force" in capsys.readouterr().err and (out / "mine.txt").exists()
    assert main(["models", "import", str(tmp_path / "ct2"), str(out), "--force"]) == 0


def test_import_writes_the_weights_with_the_usual_mode(tmp_path: Path) -> None:
    from tests.audio.test_whisper_imports import _write_ct2

    source = _write_ct2(tmp_path / "whisper-ct2", seed=1)
    with umask(0o022):
        assert main(["models", "import", str(source), str(tmp_path / "new")]) == 0
    assert tree_modes(tmp_path / "new") == {"folders": {0o755}, "files": {0o644}}  # the weights came out 0600


@pytest.mark.parametrize("where, words", [(".", "is the source dir"), ("..", "contains the source dir"),
                                          ("mlx", "is inside the source dir")])
def test_import_refuses_an_output_that_is_the_source_holds_it_or_lies_in_it(
        where: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --force removed OUTPUT first: the checkpoint (and, with OUTPUT its parent, everything beside it) was deleted.
    from tests.audio.test_whisper_imports import _write_ct2

    source = _write_ct2(tmp_path / "whisper-ct2", seed=1)  # a real checkpoint: the import would run
    checkpoint = (source / "model.bin").read_bytes()
    (tmp_path / "sibling.txt").write_text("keep me")
    output = source / where
    assert main(["models", "import", str(source), str(output), "--force"]) == 2
    assert words in capsys.readouterr().err
    assert (source / "model.bin").read_bytes() == checkpoint and (tmp_path / "sibling.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sibling.txt", "whisper-ct2"]
    assert [p.name for p in source.iterdir()] == ["model.bin"]
