"""CUDA stream priorities for MLX's threads: the decode thread's stream first, on the GPU's block scheduler.

MLX gives each thread its own CUDA stream, all at the default (lowest) priority, and offers no way to set one. So
the prefill lane's prompt chunks and Whisper's steps, on their own threads, compete with the decode steps for the
GPU on equal terms, and a decode step that meets a 512-token chunk or an encoder layer waits behind its blocks
(bench/RESULTS.md: the slow decode steps under Poisson arrivals, chat's token gaps beside live speech). A stream
of higher priority has its pending blocks scheduled first whenever an SM frees up.

MLX's CUDA runtime is linked statically and creates its streams through the driver, which it finds with `dlsym`
on libcuda's handle. This library, preloaded into the serving worker (`LD_PRELOAD`, set by `tandem serve` for its
worker on a CUDA build of MLX), hooks that lookup: streams created by a thread that called
`tandem_stream_priority_raise(1)` get the device's greatest priority; every other stream is created as before.
Every other `dlsym` goes on to the C library's by a tail call, so its caller-relative lookups keep their meaning.
`TANDEM_STREAM_PRIORITY=off` leaves it out.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import sys
from pathlib import Path
from typing import MutableMapping

from engine.native_build import build_library

__all__ = ["SOURCE", "ENV_SWITCH", "build", "wanted", "preload_for_children", "raise_this_thread", "counts", "describe"]

_log = logging.getLogger(__name__)

ENV_SWITCH = "TANDEM_STREAM_PRIORITY"

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef void *CUstream;
typedef CUresult (*gpa2_fn)(const char *, void **, int, uint64_t, void *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, uint64_t);
typedef CUresult (*create_fn)(CUstream *, unsigned int);
typedef CUresult (*create_prio_fn)(CUstream *, unsigned int, int);
typedef CUresult (*range_fn)(int *, int *);
typedef void *(*dlsym_fn)(void *, const char *);
#define EXPORT __attribute__((visibility("default")))

static dlsym_fn next_dlsym;
static gpa2_fn real_gpa2;
static gpa1_fn real_gpa1;
static create_fn real_create;
static create_prio_fn real_create_prio;
static range_fn real_range;
static __thread int thread_raised;
static long raised_streams, plain_streams;

EXPORT void tandem_stream_priority_raise(int on) { thread_raised = on; }
EXPORT long tandem_stream_priority_raised(void) { return __atomic_load_n(&raised_streams, __ATOMIC_RELAXED); }
EXPORT long tandem_stream_priority_plain(void) { return __atomic_load_n(&plain_streams, __ATOMIC_RELAXED); }
EXPORT int tandem_stream_priority_hooked(void) { return real_gpa2 != 0 || real_gpa1 != 0; }

static int greatest(void) {
    int least = 0, great = 0;
    return real_range != 0 && real_range(&least, &great) == 0 ? great : 0;
}

static CUresult hooked_create_prio(CUstream *s, unsigned int flags, int prio) {
    if (thread_raised) {
        __atomic_add_fetch(&raised_streams, 1, __ATOMIC_RELAXED);
        prio = greatest();
    } else {
        __atomic_add_fetch(&plain_streams, 1, __ATOMIC_RELAXED);
    }
    return real_create_prio(s, flags, prio);
}

static CUresult hooked_create(CUstream *s, unsigned int flags) {
    if (thread_raised && real_create_prio != 0)
        return hooked_create_prio(s, flags, 0);
    __atomic_add_fetch(&plain_streams, 1, __ATOMIC_RELAXED);
    return real_create(s, flags);
}

static CUresult lookup(const char *sym, void **pfn, int version, uint64_t flags) {
    if (real_gpa2 != 0)
        return real_gpa2(sym, pfn, version, flags, 0);
    return real_gpa1 != 0 ? real_gpa1(sym, pfn, version, flags) : 1;
}

static CUresult hooked_gpa2(const char *, void **, int, uint64_t, void *);
static CUresult hooked_gpa1(const char *, void **, int, uint64_t);

/* What the driver handed out for `sym`, swapped for a hook where stream creation is concerned. */
static void swap(const char *sym, void **pfn, int version, uint64_t flags) {
    void *p = 0;
    if (strcmp(sym, "cuStreamCreate") == 0 || strcmp(sym, "cuStreamCreateWithPriority") == 0) {
        if (real_range == 0 && lookup("cuCtxGetStreamPriorityRange", &p, version, flags) == 0)
            real_range = (range_fn)p;
        if (sym[14] == 0) {
            real_create = (create_fn)*pfn;
            if (real_create_prio == 0 && lookup("cuStreamCreateWithPriority", &p, version, flags) == 0)
                real_create_prio = (create_prio_fn)p;
            if (real_create_prio != 0)
                *pfn = (void *)hooked_create;
        } else {
            real_create_prio = (create_prio_fn)*pfn;
            *pfn = (void *)hooked_create_prio;
        }
    } else if (strcmp(sym, "cuGetProcAddress") == 0) {
        if (version >= 12000) {
            real_gpa2 = (gpa2_fn)*pfn;
            *pfn = (void *)hooked_gpa2;
        } else {
            real_gpa1 = (gpa1_fn)*pfn;
            *pfn = (void *)hooked_gpa1;
        }
    }
}

static CUresult hooked_gpa2(const char *sym, void **pfn, int version, uint64_t flags, void *status) {
    CUresult r = real_gpa2(sym, pfn, version, flags, status);
    if (r == 0 && sym != 0 && pfn != 0 && *pfn != 0)
        swap(sym, pfn, version, flags);
    return r;
}

static CUresult hooked_gpa1(const char *sym, void **pfn, int version, uint64_t flags) {
    CUresult r = real_gpa1(sym, pfn, version, flags);
    if (r == 0 && sym != 0 && pfn != 0 && *pfn != 0)
        swap(sym, pfn, version, flags);
    return r;
}

static dlsym_fn find_next_dlsym(void) {
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", 0};
    for (int i = 0; versions[i] != 0; ++i) {
        dlsym_fn f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (f == 0)
            f = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", versions[i]);
        if (f != 0 && f != (dlsym_fn)dlsym)
            return f;
    }
    return 0;
}

/* The CUDA runtime finds the driver's cuGetProcAddress with dlsym on libcuda's handle. */
EXPORT void *dlsym(void *handle, const char *name) {
    dlsym_fn next = next_dlsym;
    if (next == 0)
        next_dlsym = next = find_next_dlsym();
    if (name != 0 && name[0] == 'c' && name[1] == 'u' && name[2] == 'G') {
        void *p = next(handle, name);
        if (p != 0 && strcmp(name, "cuGetProcAddress_v2") == 0) {
            real_gpa2 = (gpa2_fn)p;
            return (void *)hooked_gpa2;
        }
        if (p != 0 && strcmp(name, "cuGetProcAddress") == 0) {
            real_gpa1 = (gpa1_fn)p;
            return (void *)hooked_gpa1;
        }
        return p;
    }
    return next(handle, name); /* a tail call: glibc's dlsym sees our caller's return address (RTLD_NEXT) */
}
"""


def build(cache_dir: Path) -> Path | None:
    """The compiled library in `cache_dir` (built now if missing), or None without a C compiler. Raises nothing."""
    return build_library(SOURCE, "tandem-stream-priority", cache_dir)


def _cuda_mlx_installed() -> bool:
    """Whether a CUDA build of MLX is installed, without importing MLX (the serving parent never does)."""
    try:
        return any((dist.metadata["Name"] or "").lower().replace("_", "-").startswith("mlx-cuda")
                   for dist in importlib.metadata.distributions())
    except Exception:  # a broken distribution's metadata must not stop serving
        return False


def wanted(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether serving should preload the library: Linux, a CUDA build of MLX, and not turned off. Raises nothing."""
    env = os.environ if environ is None else environ
    if env.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return False
    return sys.platform.startswith("linux") and _cuda_mlx_installed()


def preload_for_children(environ: MutableMapping[str, str], cache_dir: Path) -> Path | None:
    """Put the library (built into `cache_dir` if needed) first in `environ`'s LD_PRELOAD, so processes started
    with that environment load it; returns its path, or None when it cannot be built. Raises nothing."""
    built = build(cache_dir)
    if built is None:
        _log.info("no C compiler: MLX's CUDA streams keep one priority (decode steps share the GPU equally with "
                  "prompt chunks and Whisper steps)")
        return None
    present = environ.get("LD_PRELOAD", "").split()
    if str(built) not in present:
        environ["LD_PRELOAD"] = " ".join([str(built), *present])
    return built


def _library() -> ctypes.CDLL | None:
    """The preloaded library's functions, found in the process's global scope; None when it was not preloaded."""
    try:
        lib = ctypes.CDLL(None)
        lib.tandem_stream_priority_raise  # noqa: B018 (present only when preloaded)
    except (OSError, AttributeError):
        return None
    return lib


def raise_this_thread() -> bool:
    """Give the CUDA streams this thread creates from now on the greatest priority (call before the thread's first
    MLX op). False when the library is not loaded. Raises nothing."""
    lib = _library()
    if lib is None:
        return False
    lib.tandem_stream_priority_raise(1)
    return True


def counts() -> dict[str, int] | None:
    """{"hooked": whether the driver lookup passed through the library, "raised": streams created at the greatest
    priority, "plain": the others}; None when the library is not loaded. Raises nothing."""
    lib = _library()
    if lib is None:
        return None
    lib.tandem_stream_priority_raised.restype = ctypes.c_long
    lib.tandem_stream_priority_plain.restype = ctypes.c_long
    return {"hooked": int(lib.tandem_stream_priority_hooked()), "raised": int(lib.tandem_stream_priority_raised()),
            "plain": int(lib.tandem_stream_priority_plain())}


def describe() -> str | None:
    """One line for the startup banner; None when the library is not loaded. Raises nothing."""
    seen = counts()
    if seen is None:
        return None
    if not seen["hooked"]:
        return "CUDA streams: the priority library is loaded, but MLX's driver lookup did not pass through it " \
               "(streams keep one priority)"
    return f"CUDA streams: the decode thread's at the device's greatest priority ({seen['raised']} raised, " \
           f"{seen['plain']} at the default)"
