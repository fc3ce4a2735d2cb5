"""A `cblas_sgemm` in front of OpenBLAS that runs products of one or two rows as GEMVs.

MLX's CPU backend computes every matmul with `cblas_sgemm`. OpenBLAS forwards GEMMs of one row or column to
GEMV only on ARM64, RISC-V and POWER builds (`GEMM_GEMV_FORWARD`); on x86-64 a one-row product goes through the
level-3 driver, which packs the whole weight matrix first. A decode step is such products: measured on this
2-core machine, SmolLM2's 49,152 × 576 output projection took 15 ms for one row against 4.7 ms as a GEMV, and
Whisper tiny.en's decoder forward 28 ms against 7-9 ms. No library fixes this for MLX, so a small C function,
compiled once with the system C compiler and cached beside the renamed OpenBLAS, does: loaded into the global
symbol scope before OpenBLAS, its `cblas_sgemm` is the one libmlx binds to; it calls OpenBLAS's `cblas_sgemv`
per row up to `GEMV_ROWS` rows and OpenBLAS's own `cblas_sgemm` otherwise. Without a compiler nothing changes.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from engine.file_modes import plain_modes

__all__ = ["GEMV_ROWS", "SOURCE", "build", "install", "products"]

_log = logging.getLogger(__name__)
_loaded: ctypes.CDLL | None = None  # the shim this process installed

# Up to this many rows a product is GEMVs: measured for SmolLM2's and tiny.en's decode shapes, two GEMVs still
# beat OpenBLAS's GEMM (vocabulary: 11.3 vs 15.4 ms); from three or four rows on, the GEMM wins on large weights.
GEMV_ROWS = 2

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112, GEMV_ROWS = @GEMV_ROWS@ };
static sgemm_fn real_sgemm;
static sgemv_fn real_sgemv;
static long gemv_products; /* products run as GEMVs, for tests */

__attribute__((visibility("default"))) long tandem_gemv_shim_products(void) {
    return __atomic_load_n(&gemv_products, __ATOMIC_RELAXED);
}

__attribute__((visibility("default"))) void tandem_gemv_shim_init(sgemm_fn gemm, sgemv_fn gemv) {
    real_sgemm = gemm;
    real_sgemv = gemv;
}

/* Preloaded in front of an OpenBLAS (LD_PRELOAD="shim openblas", as bench/ gives the peer), the next library's
   functions serve; racing first calls store the same pointers. */
static void resolve_next(void) {
    real_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    real_sgemv = (sgemv_fn)dlsym(RTLD_NEXT, "cblas_sgemv");
}

/* C = alpha op(A) op(B) + beta C, row-major: row i of C is op(B)^T times row i of op(A). */
__attribute__((visibility("default"))) void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                                                        const float *a, int lda, const float *b, int ldb, float beta,
                                                        float *c, int ldc) {
    if (real_sgemm == 0 || real_sgemv == 0)
        resolve_next();
    if (order == ROW_MAJOR && m >= 1 && m <= GEMV_ROWS && n >= 1 && k >= 1 && (ta == NO_TRANS || ta == TRANS)
        && (tb == NO_TRANS || tb == TRANS)) {
        for (int i = 0; i < m; ++i) {
            const float *x = ta == NO_TRANS ? a + (long)i * lda : a + i;
            int incx = ta == NO_TRANS ? 1 : lda;
            if (tb == NO_TRANS) /* B is K x N */
                real_sgemv(ROW_MAJOR, TRANS, k, n, alpha, b, ldb, x, incx, beta, c + (long)i * ldc, 1);
            else /* B is N x K */
                real_sgemv(ROW_MAJOR, NO_TRANS, n, k, alpha, b, ldb, x, incx, beta, c + (long)i * ldc, 1);
        }
        __atomic_add_fetch(&gemv_products, 1, __ATOMIC_RELAXED);
        return;
    }
    real_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
""".replace("@GEMV_ROWS@", str(GEMV_ROWS))


def build(cache_dir: Path) -> Path | None:
    """The compiled shim in `cache_dir` (built now if missing), or None when no C compiler is found or it fails.
    Raises nothing."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    target = cache_dir / f"libtandem-gemv-{digest}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        _log.info("no C compiler (cc, gcc, clang or $CC): MLX's one- and two-row matmuls stay OpenBLAS GEMMs, "
                  "~1.6x slower single-stream decode on a CPU")
        return None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Compile to a private temp name and rename into place: concurrent first starts never load half a file.
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".gemv-", suffix=".so")
        os.close(fd)
        src = tmp[:-3] + ".c"
        try:
            Path(src).write_text(SOURCE, encoding="ascii")
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o", tmp, src, "-ldl"],
                           check=True, capture_output=True, timeout=60)
            plain_modes(Path(tmp), executable=True)  # mkstemp's 0600 (0711 once linked): others could not load it
            os.replace(tmp, target)
        finally:
            for leftover in (tmp, src):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("could not build the GEMV shim with %s: %s", compiler, exc)
        return None
    return target


def install(shim_path: Path, openblas: ctypes.CDLL) -> ctypes.CDLL | None:
    """Load the shim into the global symbol scope and point it at `openblas` (loaded, not yet global: the caller
    makes it global afterwards, so the shim's `cblas_sgemm` comes first). Returns the shim's handle, or None when
    it cannot be loaded. Raises nothing."""
    try:  # OpenBLAS's functions first: a shim in the global scope must never be left pointing nowhere
        gemm = ctypes.cast(openblas.cblas_sgemm, ctypes.c_void_p).value
        gemv = ctypes.cast(openblas.cblas_sgemv, ctypes.c_void_p).value
        shim = ctypes.CDLL(str(shim_path), mode=os.RTLD_GLOBAL)
    except (OSError, AttributeError) as exc:
        _log.warning("GEMV shim %s not loaded: %s", shim_path, exc)
        return None
    shim.tandem_gemv_shim_init(ctypes.c_void_p(gemm), ctypes.c_void_p(gemv))
    shim.tandem_gemv_shim_products.restype = ctypes.c_long
    global _loaded
    _loaded = shim
    return shim


def products() -> int | None:
    """Matmuls this process ran as GEMVs so far, or None when no shim is installed. Raises nothing."""
    return int(_loaded.tandem_gemv_shim_products()) if _loaded is not None else None
