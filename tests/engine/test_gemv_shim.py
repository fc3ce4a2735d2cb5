"""engine/gemv_shim.py: in front of OpenBLAS, MLX's products of one or two rows run as GEMVs and give what
numpy gives, for every layout MLX passes; larger products stay GEMMs; without a C compiler, or with
TANDEM_BLAS_GEMV=off, nothing changes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import mlx.core as mx
import numpy as np
import pytest

from engine import gemv_shim
from engine.backend import blas_info
from tests.fixtures.file_access import umask

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the BLAS route is Linux-only")
needs_shim = pytest.mark.skipif(blas_info().gemv_rows == 0, reason="no GEMV shim here (no C compiler, or no OpenBLAS)")


@pytest.fixture(autouse=True)
def on_the_cpu() -> Iterator[None]:
    # The shim is the CPU backend's BLAS: on a GPU host MLX would run these products on the device instead.
    before = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(before)


def products(fn: object) -> int:
    before = gemv_shim.products() or 0
    mx.eval(fn())  # type: ignore[operator]
    return (gemv_shim.products() or 0) - before


@needs_shim
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_products_of_every_layout_equal_numpys(rows: int) -> None:
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 96), dtype=np.float32)
    w = rng.standard_normal((200, 96), dtype=np.float32)  # a Linear's weight: out x in
    c = rng.standard_normal((rows, 200), dtype=np.float32)
    ma, mw, mc = mx.array(a), mx.array(w), mx.array(c)
    at = mx.array(np.ascontiguousarray(a.T))  # A stored transposed (MLX passes CblasTrans for it)
    wt = mx.array(np.ascontiguousarray(w.T))
    want = a @ w.T
    for got in (ma @ mw.T, ma @ wt, at.T @ mw.T, at.T @ wt):
        np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)
    got = mx.addmm(mc, ma, mw.T, alpha=0.5, beta=2.0)  # beta: C is read, not only written
    np.testing.assert_allclose(np.array(got), 0.5 * want + 2.0 * c, rtol=1e-4, atol=1e-4)
    batched = mx.array(np.stack([a, 2 * a])) @ mw.T  # a batch of products, one call each
    np.testing.assert_allclose(np.array(batched), np.stack([want, 2 * want]), rtol=1e-4, atol=1e-4)


@needs_shim
def test_one_or_two_rows_run_as_gemvs_and_more_as_gemms() -> None:
    w = mx.random.normal((300, 64))
    mx.eval(w)
    assert products(lambda: mx.random.normal((1, 64)) @ w.T) == 1
    assert products(lambda: mx.random.normal((2, 64)) @ w.T) == 1
    assert products(lambda: mx.random.normal((3, 64)) @ w.T) == 0
    assert products(lambda: mx.random.normal((64, 3)).T @ w.T) == 0
    assert blas_info().gemv_rows == gemv_shim.GEMV_ROWS and "GEMV" in blas_info().describe()


_PROBE = textwrap.dedent(
    """
    import json
    from engine.backend import blas_info, ensure_fast_blas
    ensure_fast_blas()
    import mlx.core as mx
    import numpy as np
    from engine import gemv_shim
    mx.set_default_device(mx.cpu)
    a, w = np.ones((1, 8), np.float32), np.arange(24, dtype=np.float32).reshape(3, 8)
    out = np.array(mx.array(a) @ mx.array(w).T)
    print(json.dumps({"name": blas_info().name, "gemv_rows": blas_info().gemv_rows,
                      "right": bool(np.allclose(out, a @ w.T)), "products": gemv_shim.products()}))
    """
)


def probe(cache: Path, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("TANDEM_BLAS", "TANDEM_BLAS_GEMV", "CC")}
    environment.update(XDG_CACHE_HOME=str(cache), **env)
    done = subprocess.run([sys.executable, "-c", _PROBE], env=environment, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_shim
def test_the_shim_is_built_once_into_the_cache(tmp_path: Path) -> None:
    first = probe(tmp_path)
    assert (first["name"], first["gemv_rows"], first["right"], first["products"]) == ("openblas", 2, True, 1)
    built = list((tmp_path / "mlx-tandem" / "blas").glob("libtandem-gemv-*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    assert probe(tmp_path)["gemv_rows"] == 2 and built[0].stat().st_mtime_ns == mtime
    assert not [p for p in built[0].parent.iterdir() if p.name.startswith(".")]


@needs_shim
@pytest.mark.parametrize("mask, mode", [(0o022, 0o755), (0o077, 0o700)])
def test_the_shim_has_the_mode_a_plain_build_gives(mask: int, mode: int, tmp_path: Path) -> None:
    # Linked into a mkstemp file (0600), it came out 0711: another user sharing the cache could not load it.
    with umask(mask):
        built = gemv_shim.build(tmp_path / "blas")
    assert built is not None and stat.S_IMODE(built.stat().st_mode) == mode


def test_without_a_compiler_or_when_turned_off_nothing_changes(tmp_path: Path) -> None:
    no_compiler = probe(tmp_path / "a", CC=str(tmp_path / "no-such-cc"))
    off = probe(tmp_path / "b", TANDEM_BLAS_GEMV="off")
    for result in (no_compiler, off):
        assert (result["name"], result["gemv_rows"], result["right"], result["products"]) == ("openblas", 0, True, None)
    assert not list(tmp_path.glob("*/mlx-tandem/blas/libtandem-gemv-*.so"))


@needs_shim
def test_preloaded_in_front_of_openblas_it_serves_a_process_without_tandem() -> None:
    # How bench/ gives mlx_lm.server the same BLAS: no init call, the next library's functions found by the shim.
    code = textwrap.dedent(
        """
        import ctypes, json, sys
        import mlx.core as mx
        import numpy as np
        mx.set_default_device(mx.cpu)
        shim = ctypes.CDLL(sys.argv[1])
        shim.tandem_gemv_shim_products.restype = ctypes.c_long
        a, w = np.ones((1, 8), np.float32), np.arange(24, dtype=np.float32).reshape(3, 8)
        big = np.ones((4, 8), np.float32)
        right = np.allclose(np.array(mx.array(a) @ mx.array(w).T), a @ w.T)
        right = right and np.allclose(np.array(mx.array(big) @ mx.array(w).T), big @ w.T)
        print(json.dumps({"right": bool(right), "products": shim.tandem_gemv_shim_products()}))
        """
    )
    info = blas_info()
    env = {**os.environ, "LD_PRELOAD": info.preload() or ""}
    done = subprocess.run([sys.executable, "-c", code, str(info.gemv_path)], env=env, capture_output=True, text=True,
                          check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"right": True, "products": 1}
    assert (info.preload() or "").split() == [info.gemv_path, info.path]
