"""Small C libraries the engine builds once with the system C compiler and caches by their source's hash.

Two exist: the GEMV shim in front of OpenBLAS (engine/gemv_shim.py) and the kernel-launch priority shim in front
of the CUDA driver (engine/launch_priority.py). No wheel carries either; both are a few dozen lines of C.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["compiler", "compile_library"]

_log = logging.getLogger(__name__)


def compiler() -> str | None:
    """$CC, else cc, gcc or clang on PATH; None when there is none. Raises nothing."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def compile_library(source: str, stem: str, cache_dir: Path) -> Path | None:
    """`cache_dir/lib{stem}-{hash}.so` built from `source` (now, if missing), or None when no compiler is found or
    it fails (logged). Raises nothing."""
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
