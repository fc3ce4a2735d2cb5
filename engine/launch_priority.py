"""Chat decode kernels first on the GPU: a `cuLaunchKernelEx` in front of the CUDA driver's that gives the launches of
threads that ask for it the device's highest priority.

On a GPU, prompt chunks run on the prefill lane's thread (engine/lane.py) and Whisper's steps on the speech thread,
each on its own CUDA stream beside the chat decode steps. All of MLX's streams are created at the default priority,
the lowest, so a decode step's small kernels wait their turn behind a 512-token chunk's GEMM blocks: under Poisson
arrivals on the H100 the slow decode steps waited 2.8 ms for the device against 0.86 ms at the median (/stats
`iteration_times`). MLX offers no stream priority; it launches its JIT kernels (fused and compiled elementwise
graphs, custom kernels: the decode step's fused GEMVs and attention) through the driver's `cuLaunchKernelEx`, which
libmlx takes from libcuda.so.1 at load time. Loaded into the global symbol scope before mlx, this library's
`cuLaunchKernelEx` is the one libmlx binds to: it adds `CU_LAUNCH_ATTRIBUTE_PRIORITY` to the launches of threads
that called `tandem_launch_priority_raise` and passes every other launch through unchanged. Kernels MLX launches
through its static CUDA runtime and cuBLAS's are not seen (default priority, as before).
Linux with MLX's CUDA build only; TANDEM_LAUNCH_PRIORITY=off leaves the driver alone.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import sys
from pathlib import Path

from engine.native_build import compile_library

__all__ = ["SOURCE", "build", "install", "install_for_mlx_cuda", "launches", "raise_this_thread", "wanted"]

_log = logging.getLogger(__name__)
_loaded: ctypes.CDLL | None = None  # the shim this process installed

# The driver's ABI (cuda.h, CUDA 12 and 13): a launch attribute is an id padded to 8 bytes and a 64-byte union.
SOURCE = r"""
typedef int CUresult;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct {
    int id;
    char pad[4];
    union { char bytes[64]; int priority; } value;
} CUlaunchAttribute;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
typedef CUresult (*launch_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*range_fn)(int *, int *);
enum { PRIORITY = 8, MAX_ATTRS = 15 };

static launch_fn real_launch;
static range_fn priority_range;
static __thread int raised;  /* this thread's launches go first */
static int greatest;  /* the device's highest priority (numerically least), read at the first raised launch */
static int greatest_known;
static long raised_launches;

__attribute__((visibility("default"))) void tandem_launch_priority_init(launch_fn launch, range_fn range) {
    real_launch = launch;
    priority_range = range;
}

__attribute__((visibility("default"))) void tandem_launch_priority_raise(int on) { raised = on; }

__attribute__((visibility("default"))) long tandem_launch_priority_launches(void) {
    return __atomic_load_n(&raised_launches, __ATOMIC_RELAXED);
}

__attribute__((visibility("default"))) CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                                                 void **params, void **extra) {
    if (!raised || config == 0 || config->numAttrs >= MAX_ATTRS)
        return real_launch(config, f, params, extra);
    if (!__atomic_load_n(&greatest_known, __ATOMIC_ACQUIRE)) {
        int least = 0, most = 0;
        if (priority_range == 0 || priority_range(&least, &most) != 0)
            most = least;
        greatest = most;  /* racing first launches store the same value */
        __atomic_store_n(&greatest_known, 1, __ATOMIC_RELEASE);
    }
    CUlaunchAttribute attrs[MAX_ATTRS + 1];
    CUlaunchConfig raised_config = *config;
    for (unsigned int i = 0; i < config->numAttrs; ++i)
        attrs[i] = config->attrs[i];
    attrs[config->numAttrs] = (CUlaunchAttribute){0};
    attrs[config->numAttrs].id = PRIORITY;
    attrs[config->numAttrs].value.priority = greatest;
    raised_config.attrs = attrs;
    raised_config.numAttrs = config->numAttrs + 1;
    __atomic_add_fetch(&raised_launches, 1, __ATOMIC_RELAXED);
    return real_launch(&raised_config, f, params, extra);
}
"""


def wanted() -> bool:
    """Whether this process should install the shim: Linux, MLX's CUDA build installed, TANDEM_LAUNCH_PRIORITY not
    off, mlx not yet imported (libmlx binds its driver symbols as it loads). Raises nothing."""
    if not sys.platform.startswith("linux") or "mlx.core" in sys.modules:
        return False
    if os.environ.get("TANDEM_LAUNCH_PRIORITY", "").strip().lower() in ("off", "0", "false", "no"):
        return False
    try:
        names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in importlib.metadata.distributions()}
    except Exception:  # a broken dist-info elsewhere on the path must not stop the server
        return False
    return any(n.startswith("mlx-cuda") for n in names)


def build(cache_dir: Path) -> Path | None:
    """The compiled shim in `cache_dir` (built now if missing), or None without a C compiler. Raises nothing."""
    return compile_library(SOURCE, "tandem-launch-priority", cache_dir)


def install(shim_path: Path, driver: ctypes.CDLL) -> ctypes.CDLL | None:
    """Load the shim into the global symbol scope, pointed at `driver`'s functions (libcuda.so.1, or a stand-in in
    tests). Returns its handle, or None when it cannot be loaded. Raises nothing."""
    global _loaded
    try:  # the driver's functions first: a shim in the global scope must never be left pointing nowhere
        launch = ctypes.cast(driver.cuLaunchKernelEx, ctypes.c_void_p).value
        prange = ctypes.cast(driver.cuCtxGetStreamPriorityRange, ctypes.c_void_p).value
        shim = ctypes.CDLL(str(shim_path), mode=os.RTLD_GLOBAL)
    except (OSError, AttributeError) as exc:
        _log.warning("launch priority shim %s not loaded: %s", shim_path, exc)
        return None
    shim.tandem_launch_priority_init(ctypes.c_void_p(launch), ctypes.c_void_p(prange))
    shim.tandem_launch_priority_launches.restype = ctypes.c_long
    shim.tandem_launch_priority_raise.argtypes = [ctypes.c_int]
    _loaded = shim
    return shim


def install_for_mlx_cuda(cache_dir: Path) -> Path | None:
    """Build and install the shim in front of libcuda.so.1 when `wanted()`; its path, or None. Raises nothing."""
    if not wanted():
        return None
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        _log.info("no CUDA driver to put the launch priority shim in front of: %s", exc)
        return None
    built = build(cache_dir)
    if built is None:
        _log.info("no C compiler: chat decode kernels launch at the default CUDA priority")
        return None
    return built if install(built, driver) is not None else None


def raise_this_thread(on: bool = True) -> bool:
    """Give (or take back) this thread's kernel launches the device's highest priority. Whether a shim is installed
    to do it. Raises nothing."""
    if _loaded is None:
        return False
    _loaded.tandem_launch_priority_raise(1 if on else 0)
    return True


def launches() -> int | None:
    """Launches this process raised so far, or None when no shim is installed. Raises nothing."""
    return int(_loaded.tandem_launch_priority_launches()) if _loaded is not None else None
