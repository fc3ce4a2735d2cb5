"""engine/launch_priority.py: loaded before a library that takes `cuLaunchKernelEx` from libcuda.so.1 (as libmlx's
CUDA build does), the shim's function is the one that library calls; launches from a thread that asked (the chat
decode thread, `EngineThread(device_first=True)`) carry the device's highest priority, other threads' pass through
unchanged, attributes already there kept. A stand-in driver built here records what it was given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import launch_priority
from engine.native_build import compiler

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim is for Linux's CUDA build"),
    pytest.mark.skipif(compiler() is None, reason="no C compiler"),
]

# A stand-in libcuda.so.1: records the last launch's attributes; priorities range from 0 (least) to -5 (greatest).
_DRIVER = r"""
typedef struct { int id; char pad[4]; union { char bytes[64]; int priority; } value; } Attr;
typedef struct { unsigned int g[7]; void *stream; Attr *attrs; unsigned int numAttrs; } Config;
static int last_n = -1, last_ids[4], last_values[4], launches;
__attribute__((visibility("default"))) int cuLaunchKernelEx(const Config *c, void *f, void **p, void **e) {
    last_n = (int)c->numAttrs;
    for (unsigned int i = 0; i < c->numAttrs && i < 4; ++i) {
        last_ids[i] = c->attrs[i].id;
        last_values[i] = c->attrs[i].value.priority;
    }
    launches++;
    return 0;
}
__attribute__((visibility("default"))) int cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    *least = 0; *greatest = -5; return 0;
}
__attribute__((visibility("default"))) int fake_last(int what) {
    return what < 0 ? last_n : what < 4 ? last_ids[what] : what < 8 ? last_values[what - 4] : launches;
}
"""

# A stand-in libmlx: takes cuLaunchKernelEx from libcuda.so.1 at load time; launches with or without a cluster attribute.
_CONSUMER = r"""
typedef struct { int id; char pad[4]; union { char bytes[64]; int priority; unsigned int dims[3]; } value; } Attr;
typedef struct { unsigned int g[7]; void *stream; Attr *attrs; unsigned int numAttrs; } Config;
int cuLaunchKernelEx(const Config *c, void *f, void **p, void **e);
__attribute__((visibility("default"))) int consumer_launch(int with_cluster) {
    Attr cluster = {0};
    cluster.id = 4; cluster.value.dims[0] = 2; cluster.value.dims[1] = 1; cluster.value.dims[2] = 1;
    Config c = {{1, 1, 1, 32, 1, 1, 0}, 0, with_cluster ? &cluster : 0, with_cluster ? 1u : 0u};
    return cuLaunchKernelEx(&c, 0, 0, 0);
}
"""

_PROBE = textwrap.dedent(
    """
    import ctypes, json, sys, threading
    from engine.backend import ensure_fast_blas
    ensure_fast_blas()
    from engine import launch_priority
    from engine.context import EngineThread
    consumer = ctypes.CDLL(sys.argv[1])
    driver = ctypes.CDLL("libcuda.so.1")

    def seen():
        return {"n": driver.fake_last(-1), "ids": [driver.fake_last(i) for i in range(2)],
                "values": [driver.fake_last(4 + i) for i in range(2)]}

    out = {"installed": launch_priority.launches() is not None}
    consumer.consumer_launch(0)
    out["loop_thread"] = seen()
    box = []
    decode = EngineThread("decode", device_first=True)
    decode.submit(lambda: (consumer.consumer_launch(0), box.append(seen()), consumer.consumer_launch(1),
                           box.append(seen())), lambda r, e: done.set())
    done = threading.Event()
    done.wait(10)
    other = threading.Thread(target=lambda: (consumer.consumer_launch(1), box.append(seen())))
    other.start(); other.join()
    out["decode"], out["decode_cluster"], out["other_cluster"] = box
    out["raised_launches"] = launch_priority.launches()
    print(json.dumps(out))
    """
)


def _build(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-in driver (as libcuda.so.1) and consumer library, compiled into tmp_path."""
    cc = compiler()
    assert cc is not None
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "driver.c").write_text(_DRIVER)
    (tmp_path / "consumer.c").write_text(_CONSUMER)
    subprocess.run([cc, "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1", "-o",
                    str(tmp_path / "libcuda.so.1"), str(tmp_path / "driver.c")], check=True)
    consumer = tmp_path / "libconsumer.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(consumer), str(tmp_path / "consumer.c"), "-L", str(tmp_path),
                    "-l:libcuda.so.1", f"-Wl,-rpath,{tmp_path}"], check=True)
    return tmp_path, consumer


def _probe(tmp_path: Path, cuda_build: bool, **env: str) -> dict:
    libs, consumer = _build(tmp_path)
    site = tmp_path / "site"
    if cuda_build:  # what `pip install mlx-cuda-13` leaves on the path, all wanted() looks for
        dist = site / "mlx_cuda_13-0.32.4.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlx-cuda-13\nVersion: 0.32.4\n")
    root = Path(__file__).resolve().parents[2]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    environment.update(PYTHONPATH=os.pathsep.join([str(site), str(root)]), LD_LIBRARY_PATH=str(libs),
                       XDG_CACHE_HOME=str(tmp_path / "cache"), TANDEM_BLAS="reference", **env)
    done = subprocess.run([sys.executable, "-c", _PROBE, str(consumer)], env=environment, capture_output=True,
                          text=True, check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_decode_threads_launches_go_first_and_others_pass_through(tmp_path: Path) -> None:
    out = _probe(tmp_path, cuda_build=True)
    assert out["installed"]
    assert out["loop_thread"]["n"] == 0  # a thread that did not ask: unchanged
    assert out["decode"] == {"n": 1, "ids": [8, out["decode"]["ids"][1]], "values": [-5, out["decode"]["values"][1]]}
    cluster = out["decode_cluster"]  # the cluster attribute kept, the priority after it
    assert (cluster["n"], cluster["ids"], cluster["values"][1]) == (2, [4, 8], -5)
    assert out["other_cluster"]["n"] == 1 and out["other_cluster"]["ids"][0] == 4
    assert out["raised_launches"] == 2
    assert len(list((tmp_path / "cache" / "mlx-tandem" / "native").glob("libtandem-launch-priority-*.so"))) == 1


def test_without_mlxs_cuda_build_or_when_turned_off_nothing_is_installed(tmp_path: Path) -> None:
    for sub, cuda_build, env in (("cpu", False, {}), ("off", True, {"TANDEM_LAUNCH_PRIORITY": "off"})):
        out = _probe(tmp_path / sub, cuda_build=cuda_build, **env)
        assert not out["installed"] and out["raised_launches"] is None
        assert out["decode"]["n"] == 0 and out["decode_cluster"]["n"] == 1  # the driver's own function served


def test_raising_a_thread_does_nothing_without_a_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_priority, "_loaded", None)
    assert launch_priority.raise_this_thread() is False and launch_priority.launches() is None
