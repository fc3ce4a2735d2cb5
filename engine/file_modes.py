"""The modes a plain mkdir/open gives, for what the cache writes through a private staging folder or file.

tempfile.mkdtemp makes 0700 folders and mkstemp 0600 files (and a linker adds only execute bits to those): renamed
into place as they are, a cache built by one user (root, at a container image's build) could not be read by another
(the image's runtime user). Each such writer gives what it wrote these modes before its rename into place.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["plain_modes", "process_umask"]


def _umask_now() -> int:
    """The umask, read as os.umask can only read it: by setting it. Raises nothing."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Where /proc/self/status has no Umask line (macOS, Linux before 4.7): read once here, while importing.
_IMPORT_UMASK = _umask_now()


def process_umask() -> int:
    """This process's umask, read without changing it (Linux's /proc/self/status), else as it was when this module
    was imported. Raises nothing."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _IMPORT_UMASK


def plain_modes(path: Path, *, executable: bool = False) -> None:
    """Give `path` and, for a folder, everything under it the modes a plain mkdir/open would have given: folders
    0o777 & ~umask, files 0o666 & ~umask (0o777 & ~umask when `executable`, as a compiler writes a library).
    Symbolic links are left alone. Raises OSError."""
    mask = process_umask()
    folder, file = 0o777 & ~mask, (0o777 if executable else 0o666) & ~mask
    if path.is_symlink():
        return
    if not path.is_dir():
        os.chmod(path, file)
        return
    os.chmod(path, folder)
    for top, folders, files in os.walk(path):
        for name in folders:
            if not os.path.islink(inner := os.path.join(top, name)):
                os.chmod(inner, folder)
        for name in files:
            if not os.path.islink(inner := os.path.join(top, name)):
                os.chmod(inner, file)
