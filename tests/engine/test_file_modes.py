"""engine/file_modes.py: what a private staging folder or file holds gets a plain mkdir/open's modes."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from engine.file_modes import plain_modes, process_umask
from tests.fixtures.file_access import umask


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.parametrize("mask, folders, files, programs", [(0o022, 0o755, 0o644, 0o755),
                                                            (0o077, 0o700, 0o600, 0o700),
                                                            (0o002, 0o775, 0o664, 0o775)])
def test_staged_files_get_the_modes_a_plain_write_gives(mask: int, folders: int, files: int, programs: int,
                                                        tmp_path: Path) -> None:
    with umask(mask):
        assert process_umask() == mask
        staging = Path(tempfile.mkdtemp(dir=tmp_path))  # 0700
        (staging / "inner").mkdir()
        (staging / "inner" / "config.json").write_text("{}")
        fd, weights = tempfile.mkstemp(dir=staging)  # 0600
        os.close(fd)
        outside = tmp_path / "outside"
        outside.write_text("not the staging folder's")
        outside.chmod(0o640)
        (staging / "link").symlink_to(outside)
        plain_modes(staging)
        fd, library = tempfile.mkstemp(dir=tmp_path, suffix=".so")
        os.close(fd)
        plain_modes(Path(library), executable=True)
    assert (_mode(staging), _mode(staging / "inner")) == (folders, folders)
    assert (_mode(staging / "inner" / "config.json"), _mode(Path(weights))) == (files, files)
    assert _mode(Path(library)) == programs
    assert _mode(outside) == 0o640  # a link is not followed
