"""Small C libraries compiled once with the system C compiler and cached by their source's hash (the GEMV shim in
front of OpenBLAS, the CUDA stream-priority shim). No wheel offers what they do; a compiler is common on the
machines that serve, and without one each caller goes on without its library."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["build_library", "compiler"]

_log = logging.getLogger(__name__)


def compiler() -> str | None:
    """$CC, else cc, gcc or clang from PATH; None when there is none. Raises nothing."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build_library(source: str, stem: str, cache_dir: Path) -> Path | None:
    """`cache_dir/lib<stem>-<hash>.so` compiled from `source` (built now if missing), or None when there is no C
    compiler or it fails (logged). Raises nothing."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    target = cache_dir / f"lib{stem}-{digest}.so"
    if target.exists():
        return target
    cc = compiler()
    if cc is None:
        return None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Compile to a private temp name and rename into place: concurrent first starts never load half a file.
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{stem}-", suffix=".so")
        os.close(fd)
        src = tmp[:-3] + ".c"
        try:
            Path(src).write_text(source, encoding="ascii")
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o", tmp, src, "-ldl"],
                           check=True, capture_output=True, timeout=60)
            os.replace(tmp, target)
        finally:
            for leftover in (tmp, src):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("could not build %s with %s: %s", stem, cc, exc)
        return None
    return target
