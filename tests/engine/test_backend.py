"""engine.backend: an optimised BLAS is in MLX's symbol scope after `ensure_fast_blas()`, which the entry
points (CLI, server worker) call before anything imports mlx — and importing engine or audio does no work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the BLAS route is Linux-only")

_PROBE = textwrap.dedent(
    """
    import json
    from engine.backend import blas_info, ensure_fast_blas
    ensure_fast_blas()
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((96, 80), dtype=np.float32)
    b = rng.standard_normal((80, 72), dtype=np.float32)
    product = np.array(mx.array(a) @ mx.array(b))
    m = rng.standard_normal((16, 16), dtype=np.float32) + 8 * np.eye(16, dtype=np.float32)
    inverse = np.array(mx.linalg.inv(mx.array(m), stream=mx.cpu))
    info = blas_info()
    from threadpoolctl import ThreadpoolController
    import os
    pools = {("mlx" if info.path and os.path.realpath(c.filepath) == os.path.realpath(info.path) else "other"):
             c.num_threads for c in ThreadpoolController().select(user_api="blas").lib_controllers}
    print(json.dumps({
        "name": info.name, "path": info.path, "reason": info.reason, "threads": info.threads, "pools": pools,
        "matmul_err": float(np.abs(product - a @ b).max()),
        "inv_err": float(np.abs(inverse @ m - np.eye(16)).max()),
    }))
    """
)


def _probe(tmp_path, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("TANDEM_BLAS", "OPENBLAS_NUM_THREADS")}
    environment.update(XDG_CACHE_HOME=str(tmp_path), **env)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=environment, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ensure_fast_blas_loads_openblas_and_mlx_matmul_matches_numpy(tmp_path) -> None:
    result = _probe(tmp_path)
    assert result["name"] == "openblas", result
    assert result["matmul_err"] < 1e-3
    assert result["inv_err"] < 1e-3


def test_renamed_library_is_cached_and_reused(tmp_path) -> None:
    first = _probe(tmp_path)
    if "scipy-openblas32" not in first["reason"]:
        pytest.skip(f"a system OpenBLAS was chosen: {first['reason']}")
    cached = list((tmp_path / "mlx-tandem" / "blas").glob("libopenblas*.so"))
    assert [str(p) for p in cached] == [first["path"]]
    mtime = cached[0].stat().st_mtime_ns
    second = _probe(tmp_path)
    assert second["path"] == first["path"]
    assert cached[0].stat().st_mtime_ns == mtime
    assert not [p for p in cached[0].parent.iterdir() if p.name.startswith(".")]


def test_reference_override_keeps_mlx_blas(tmp_path) -> None:
    result = _probe(tmp_path, TANDEM_BLAS="reference")
    assert result["name"] == "reference"
    assert result["matmul_err"] < 1e-3


def test_mlx_imported_first_warns_and_reports_reference(tmp_path) -> None:
    code = ("import warnings, mlx.core\nwarnings.simplefilter('error')\n"
            "from engine.backend import ensure_fast_blas\nensure_fast_blas()")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("TANDEM_BLAS", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert "mlx was imported before engine" in done.stderr


def test_unwritable_cache_falls_back_to_a_temp_dir(tmp_path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("a file where the cache dir would go")
    result = _probe(blocked)
    assert result["name"] == "openblas", result
    assert result["matmul_err"] < 1e-3


def test_path_override_is_loaded_first(tmp_path) -> None:
    chosen = _probe(tmp_path)
    result = _probe(tmp_path, TANDEM_BLAS=chosen["path"])
    assert (result["name"], result["path"], result["reason"]) == ("openblas", chosen["path"], "TANDEM_BLAS")
    assert result["matmul_err"] < 1e-3 and result["inv_err"] < 1e-3


def test_bad_path_override_warns_and_falls_back(tmp_path) -> None:
    result = _probe(tmp_path, TANDEM_BLAS=str(tmp_path / "missing.so"))
    assert result["name"] == "openblas" and result["reason"] != "TANDEM_BLAS"


def test_threads_leave_a_core_free_unless_chosen(tmp_path) -> None:
    from engine.backend import cores as allowed

    cores = allowed()
    assert _probe(tmp_path)["threads"] == max(1, cores - 1)
    if cores >= 2:
        assert _probe(tmp_path, OPENBLAS_NUM_THREADS="2")["threads"] == 2


@pytest.fixture
def fresh_quota():
    from engine import backend

    backend._quota_cores.cache_clear()
    yield
    backend._quota_cores.cache_clear()


def test_cores_follow_the_cgroup_cpu_quota_not_the_affinity(tmp_path, monkeypatch, fresh_quota) -> None:
    # A 2-CPU container on a 64-core node sees all 64 in its affinity: OpenBLAS got 64 threads.
    from engine import backend, cgroup_limits
    from tests.engine.test_cgroup_limits import v1_tree

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(cgroup_limits, "ROOT", str(v1_tree(tmp_path / "two", quota=200000)))
    assert (backend.cores(), backend.default_threads()) == (2, 1)
    backend._quota_cores.cache_clear()
    monkeypatch.setattr(cgroup_limits, "ROOT", str(v1_tree(tmp_path / "one", quota=100000)))
    assert (backend.cores(), backend.default_threads()) == (1, 1)
    backend._quota_cores.cache_clear()
    monkeypatch.setattr(cgroup_limits, "ROOT", str(v1_tree(tmp_path / "none", quota=-1)))
    assert backend.cores() == 64  # no quota: the affinity
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert backend.cores() == 1  # nor more than the affinity


def test_numpys_blas_runs_one_thread_beside_mlxs(tmp_path) -> None:
    # numpy's bundled OpenBLAS spins on every core after each call; MLX's keeps the threads it was given.
    assert _probe(tmp_path, OPENBLAS_NUM_THREADS="2")["pools"] == {"mlx": 2, "other": 1}
    assert _probe(tmp_path, OPENBLAS_NUM_THREADS="2", TANDEM_NUMPY_BLAS_THREADS="0")["pools"] == {"mlx": 2, "other": 2}
    assert _probe(tmp_path, OPENBLAS_NUM_THREADS="2", TANDEM_BLAS="reference")["pools"] == {"other": 1}  # a GPU host


_NO_WORK = textwrap.dedent(
    """
    import json, sys
    import engine, audio, audio.formats, audio.pcm, engine.contracts, service.app
    from engine import backend
    print(json.dumps({"chosen": backend._info is not None, "mlx": any(m.startswith("mlx") for m in sys.modules),
                      "cache": __import__("os").path.exists(sys.argv[1])}))
    """
)


def test_importing_the_packages_does_no_work(tmp_path) -> None:
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _NO_WORK, str(tmp_path / "mlx-tandem")], env=environment,
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"chosen": False, "mlx": False, "cache": False}


_ENTRY_ORDER = textwrap.dedent(
    """
    import json, sys
    from engine import backend
    seen = []
    choose = backend._choose
    backend._choose = lambda: (seen.append("mlx.core" in sys.modules), choose())[1]
    if sys.argv[1] == "cli":
        from service.cli.main import main
        main(["openapi", "--check"])
    else:
        from service.app import app_from_env
        app_from_env()
    print(json.dumps({"mlx_before_blas": seen}))
    """
)


@pytest.mark.parametrize("entry", ["cli", "server"])
def test_entry_points_load_blas_before_mlx(tmp_path, entry: str) -> None:
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "TANDEM_SERVE_CONFIG": "{}"}
    done = subprocess.run([sys.executable, "-c", _ENTRY_ORDER, entry], env=environment, capture_output=True,
                          text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"mlx_before_blas": [False]}
