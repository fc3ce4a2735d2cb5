"""engine/stream_priority.py: preloaded, the library hooks the driver lookup a statically linked CUDA runtime makes
(dlsym on libcuda's handle, then cuGetProcAddress), so streams created by a thread that asked for it get the
device's greatest priority and all others are created as before; every other dlsym keeps its meaning. A fake
driver stands in for libcuda (no GPU here): it records the priority each stream was created with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import native_build, stream_priority
from service.server import preload_for_worker

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and glibc's dlsym: Linux only"),
    pytest.mark.skipif(native_build.compiler() is None, reason="no C compiler"),
]

PLAIN = 1000  # what the fake driver records for a stream created without a priority

FAKE_DRIVER = r"""
#include <string.h>
#define _GNU_SOURCE
#include <dlfcn.h>
static int last = -1;
int fake_last_priority(void) { return last; }
static int create(void **s, unsigned int flags) { (void)flags; *s = (void *)1; last = 1000; return 0; }
static int create_prio(void **s, unsigned int flags, int prio) { (void)flags; *s = (void *)1; last = prio; return 0; }
static int range(int *least, int *greatest) { *least = 0; *greatest = -5; return 0; }
int cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, void *status);
static int gpa1(const char *sym, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(sym, pfn, version, flags, 0);
}
int cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, void *status) {
    (void)version; (void)flags; (void)status;
    if (strcmp(sym, "cuStreamCreate") == 0) *pfn = (void *)create;
    else if (strcmp(sym, "cuStreamCreateWithPriority") == 0) *pfn = (void *)create_prio;
    else if (strcmp(sym, "cuCtxGetStreamPriorityRange") == 0) *pfn = (void *)range;
    else if (strcmp(sym, "cuGetProcAddress") == 0) *pfn = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)gpa1;
    else { *pfn = 0; return 500; }
    return 0;
}
int tandem_fake_dup(void) { return 1; }
/* RTLD_NEXT from here must find the next library's tandem_fake_dup (2), not this one's. */
int fake_next_dup(void) {
    int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, "tandem_fake_dup");
    return f ? f() : 0;
}
"""

NEXT_LIBRARY = "int tandem_fake_dup(void) { return 2; }\n"

PROBE = textwrap.dedent(
    """
    import ctypes, json, os, sys
    from ctypes import CFUNCTYPE, POINTER, byref, c_char_p, c_int, c_uint, c_uint64, c_void_p
    from engine import stream_priority
    from engine.context import EngineThread

    # As the CUDA runtime does: dlopen libcuda, dlsym its cuGetProcAddress_v2 (ctypes looks names up with dlsym).
    drv = ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)
    ctypes.CDLL(sys.argv[2], mode=os.RTLD_GLOBAL)
    GPA = CFUNCTYPE(c_int, c_char_p, POINTER(c_void_p), c_int, c_uint64, c_void_p)
    gpa = GPA(ctypes.cast(drv.cuGetProcAddress_v2, c_void_p).value)

    def stream(name, version=13000, via=None):
        lookup = via or gpa
        p = c_void_p()
        assert lookup(name, byref(p), version, 0, None) == 0
        s = c_void_p()
        if name == b"cuStreamCreate":
            CFUNCTYPE(c_int, POINTER(c_void_p), c_uint)(p.value)(byref(s), 1)
        else:
            CFUNCTYPE(c_int, POINTER(c_void_p), c_uint, c_int)(p.value)(byref(s), 1, -1)
        return drv.fake_last_priority()

    out = {"before": stream(b"cuStreamCreate"), "before_with": stream(b"cuStreamCreateWithPriority")}
    p = c_void_p()
    assert gpa(b"cuGetProcAddress", byref(p), 13000, 0, None) == 0  # the lookup found through the lookup
    second = GPA(p.value)
    decode, other = EngineThread("decode", gpu_first=True), EngineThread("other")
    out["decode"] = decode.call(lambda: [stream(b"cuStreamCreate"), stream(b"cuStreamCreateWithPriority"),
                                         stream(b"cuStreamCreate", via=second)])
    out["other"] = other.call(lambda: stream(b"cuStreamCreate"))
    out["main_after"] = stream(b"cuStreamCreate")
    out["next"] = drv.fake_next_dup()
    out["counts"] = stream_priority.counts()
    out["describe"] = stream_priority.describe()
    decode.close()
    other.close()
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("fake-cuda")
    libs = []
    # The driver needs the next library: RTLD_NEXT searches the caller's own scope, after the caller.
    for name, source, extra in (("fakenext", NEXT_LIBRARY, []),
                                ("fakecuda", FAKE_DRIVER, [f"-L{root}", "-Wl,--no-as-needed", "-lfakenext", "-Wl,-rpath,$ORIGIN"])):
        (root / f"{name}.c").write_text(source)
        subprocess.run([native_build.compiler() or "cc", "-shared", "-fPIC", "-o", str(root / f"lib{name}.so"),
                        str(root / f"{name}.c"), *extra, "-ldl"], check=True, capture_output=True)
        libs.append(root / f"lib{name}.so")
    libs.reverse()  # (driver, next)
    shim = stream_priority.build(root / "cache")
    assert shim is not None
    return libs[0], libs[1], shim


def run_probe(driver: Path, after: Path, preload: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run([sys.executable, "-c", PROBE, str(driver), str(after)], env=env, capture_output=True,
                          text=True, check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_streams_of_a_raised_thread_get_the_greatest_priority_and_others_are_unchanged(fakes) -> None:
    driver, after, shim = fakes
    out = run_probe(driver, after, str(shim))
    assert out["before"] == PLAIN and out["before_with"] == -1  # not raised: created exactly as asked
    assert out["decode"] == [-5, -5, -5]  # either creation call, also through a lookup found by the lookup
    assert out["other"] == PLAIN and out["main_after"] == PLAIN  # the mark is the raised thread's alone
    assert out["next"] == 2  # dlsym(RTLD_NEXT, ...) still looks after its real caller
    assert out["counts"] == {"hooked": 1, "raised": 3, "plain": 4}
    assert "greatest priority" in out["describe"]


def test_without_the_library_nothing_changes(fakes) -> None:
    driver, after, _ = fakes
    out = run_probe(driver, after, None)
    assert out["decode"] == [PLAIN, -1, PLAIN] and out["other"] == PLAIN and out["next"] == 2
    assert out["counts"] is None and out["describe"] is None


def test_the_worker_gets_the_library_only_on_a_cuda_build_unless_turned_off(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(stream_priority, "_cuda_mlx_installed", lambda: False)
    env = {"LD_PRELOAD": "/lib/other.so"}
    assert preload_for_worker(env) is None and env == {"LD_PRELOAD": "/lib/other.so"}
    monkeypatch.setattr(stream_priority, "_cuda_mlx_installed", lambda: True)
    assert preload_for_worker({stream_priority.ENV_SWITCH: "off"}) is None
    path = preload_for_worker(env)
    assert path is not None and Path(path).parent == tmp_path / "mlx-tandem" / "native"
    assert env["LD_PRELOAD"].split() == [path, "/lib/other.so"]  # first, the rest kept
    assert preload_for_worker(env) == path and env["LD_PRELOAD"].split() == [path, "/lib/other.so"]  # once


def test_no_cuda_build_is_seen_on_this_cpu_install() -> None:
    # The check reads installed distributions only (the serving parent never imports MLX).
    import importlib.metadata

    names = {(d.metadata["Name"] or "").lower() for d in importlib.metadata.distributions()}
    assert stream_priority._cuda_mlx_installed() == any(n.replace("_", "-").startswith("mlx-cuda") for n in names)
