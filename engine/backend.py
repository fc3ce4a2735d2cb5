"""Fast CPU BLAS for MLX on Linux, loaded before MLX itself.

mlx[cpu] links netlib reference BLAS (~4 GFLOP/s for a 1024² f32 matmul on two cores). Any library that
exports the unprefixed `cblas_sgemm`/LAPACK symbols and sits in the global symbol scope before libmlx is
loaded wins symbol resolution. Routes, first match wins:

1. `TANDEM_BLAS` — a library path, or `reference` to keep MLX's bundled BLAS;
2. a system OpenBLAS (Debian `libopenblas0-pthread`);
3. `scipy-openblas32` from PyPI: its exports carry a `scipy_` prefix, so a copy with the prefix removed
   (`patchelf --rename-dynamic-symbols`) is made once in the user cache dir.

In front of an OpenBLAS, a `cblas_sgemm` that runs one- and two-row products as GEMVs (engine/gemv_shim.py;
`TANDEM_BLAS_GEMV=off` leaves OpenBLAS's GEMM alone).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from engine import cgroup_limits, gemv_shim
from engine.file_modes import plain_modes

__all__ = ["BlasInfo", "DEFAULTED_THREADS", "blas_info", "cores", "default_threads", "ensure_fast_blas",
           "user_cache_dir", "cap_other_blas"]

_log = logging.getLogger(__name__)

# Symbols libmlx.so takes from BLAS/LAPACK; a candidate must export at least these.
_REQUIRED_SYMBOLS = ("cblas_sgemm", "sgetrf_", "sgesdd_")
_SCIPY_PREFIX = "scipy_"

# Set beside OPENBLAS_NUM_THREADS when the thread count is this module's default rather than the user's choice.
DEFAULTED_THREADS = "TANDEM_BLAS_THREADS_DEFAULTED"

_info: BlasInfo | None = None
# Keeps the loaded library alive for the life of the process (gemv_shim keeps its own).
_handle: ctypes.CDLL | None = None


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS MLX's CPU backend uses: `name` (openblas, reference, accelerate), `path`, `reason`,
    and for OpenBLAS the thread count it was started with."""

    name: str
    path: str | None
    reason: str
    threads: int | None = None
    gemv_rows: int = 0  # products of up to this many rows run as GEMVs (engine/gemv_shim.py); 0: none
    gemv_path: str | None = None  # that shim's library

    def preload(self) -> str | None:
        """LD_PRELOAD that gives another process this BLAS (the shim first), or None. Raises nothing."""
        return " ".join(p for p in (self.gemv_path, self.path) if p) or None

    def describe(self) -> str:
        """One line for logs and `tandem serve`'s banner. Raises nothing."""
        where = f" ({self.path})" if self.path else ""
        threads = f", {self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else ""
        gemv = f", products of up to {self.gemv_rows} rows as GEMVs" if self.gemv_rows else ""
        return f"BLAS: {self.name}{where} — {self.reason}{threads}{gemv}"


def user_cache_dir() -> Path:
    """The per-user cache root (`$XDG_CACHE_HOME/mlx-tandem`, default ~/.cache). Raises nothing."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlx-tandem"


def blas_info() -> BlasInfo:
    """The BLAS chosen for this process, choosing it now if nothing has yet. Raises nothing."""
    return _info if _info is not None else ensure_fast_blas()


def ensure_fast_blas() -> BlasInfo:
    """Load an optimised BLAS into the global symbol scope before MLX is imported, and cap numpy's own BLAS
    (`cap_other_blas`). Idempotent.

    Raises nothing: every failure falls back to MLX's reference BLAS with a warning and a reason.
    """
    global _info
    if _info is None:
        _info = _choose()
        _log.debug(_info.describe())
        cap_other_blas()
    return _info


def cap_other_blas(threads: int = 1) -> None:
    """Cap every BLAS thread pool loaded in this process except MLX's (numpy's bundled OpenBLAS, scipy's when
    loaded) at `threads`. Their work here is small (the log-mel's
    filterbank product), and an OpenBLAS pool spins on every core for a while after each call: on 2 cores, 20
    log-mels in 1.2 s cost 1.36 s of CPU with a pool of 2 against 0.17 s with 1; a 16-core GPU host would spin 15.
    TANDEM_NUMPY_BLAS_THREADS=N sets N instead (0: leave them). Raises nothing."""
    chosen = os.environ.get("TANDEM_NUMPY_BLAS_THREADS", "").strip()
    if chosen:
        try:
            threads = int(chosen)
        except ValueError:
            pass
    if threads < 1:
        return
    try:
        import numpy  # noqa: F401  (its OpenBLAS is loaded with it)
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return
    mlx_blas = os.path.realpath(_info.path) if _info is not None and _info.path else None
    try:
        for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
            if os.path.realpath(lib.filepath) != mlx_blas and lib.num_threads > threads:
                lib.set_num_threads(threads)
    except Exception as exc:  # a foreign library's controller must not stop the process
        _log.debug("could not cap BLAS pools: %s", exc)


def _choose() -> BlasInfo:
    if sys.platform == "darwin":
        return BlasInfo("accelerate", None, "macOS: MLX uses Accelerate and Metal")
    if not sys.platform.startswith("linux"):
        return BlasInfo("reference", None, f"no fast BLAS route on {sys.platform}")
    override = os.environ.get("TANDEM_BLAS", "").strip()
    if override.lower() == "reference":
        return BlasInfo("reference", None, "TANDEM_BLAS=reference")
    if "mlx.core" in sys.modules:
        warnings.warn(
            "mlx was imported before engine.backend.ensure_fast_blas(); MLX keeps its reference BLAS "
            "(call it first)",
            RuntimeWarning,
            stacklevel=3,
        )
        return BlasInfo("reference", None, "mlx was imported before engine.backend")
    if override:
        info = _try_load(override, "openblas" if "openblas" in override else "custom", "TANDEM_BLAS")
        if info is not None:
            return info
        warnings.warn(f"TANDEM_BLAS={override!r} could not be loaded; trying the defaults", RuntimeWarning)
    system = ctypes.util.find_library("openblas")
    if system:
        info = _try_load(system, "openblas", "system OpenBLAS")
        if info is not None:
            return info
    try:
        renamed = _renamed_scipy_openblas()
    except (OSError, subprocess.CalledProcessError, LookupError) as exc:
        warnings.warn(f"could not prepare scipy-openblas32 for MLX: {exc}", RuntimeWarning)
        return BlasInfo("reference", None, f"scipy-openblas32 unavailable: {exc}")
    info = _try_load(str(renamed), "openblas", "scipy-openblas32, symbols renamed")
    if info is not None:
        return info
    return BlasInfo("reference", None, "no loadable OpenBLAS found")


def default_threads() -> int:
    """OpenBLAS threads unless the user chose: one core is left to the event loop and other processes.

    Measured on 2 cores: a second BLAS thread gains ~15-20 % when the machine is idle, but any competing
    process makes OpenBLAS threads wait on each other and decode falls 4x (prefill 13x).
    """
    return max(1, cores() - 1)


def cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota rounded up (a container
    given 2 CPUs of 64 sees all 64 in its affinity; more threads than the quota only wait on its throttling). Raises
    nothing."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    quota = _quota_cores()
    return min(allowed, quota) if quota is not None else allowed


@functools.cache
def _quota_cores() -> int | None:
    # Read once: the files take ~0.1 ms, and blas_threads reads cores() on the event loop for each Whisper window.
    return cgroup_limits.cpu_limit()


def _try_load(path: str, name: str, reason: str) -> BlasInfo | None:
    global _handle
    # OpenBLAS reads this once, when the library initialises; child processes inherit the same choice. Ours, not
    # the user's, is marked so: engine/blas_threads.py may then adapt it while the process runs.
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = str(default_threads())
        os.environ[DEFAULTED_THREADS] = "1"
    try:
        # Local first: checked, and the GEMV shim's cblas_sgemm goes into the global scope before it.
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
    except OSError as exc:
        _log.warning("BLAS candidate %s failed to load: %s", path, exc)
        return None
    if not all(hasattr(lib, symbol) for symbol in _REQUIRED_SYMBOLS):
        _log.warning("BLAS candidate %s lacks %s", path, ", ".join(_REQUIRED_SYMBOLS))
        return None
    shim = _gemv_shim(lib) if name == "openblas" else None
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_GLOBAL)  # promoted: libmlx takes the rest of BLAS and LAPACK from it
    except OSError as exc:
        _log.warning("BLAS candidate %s failed to load globally: %s", path, exc)
        return None
    _handle = lib
    threads = getattr(lib, "openblas_get_num_threads", None)
    return BlasInfo(name, path, reason, int(threads()) if threads is not None else None,
                    gemv_shim.GEMV_ROWS if shim else 0, shim)


def _gemv_shim(openblas: ctypes.CDLL) -> str | None:
    """The path of the GEMV shim installed in front of `openblas`, or None (TANDEM_BLAS_GEMV=off, or it cannot be
    built or loaded). Raises nothing."""
    if os.environ.get("TANDEM_BLAS_GEMV", "").strip().lower() in ("off", "0", "false", "no"):
        return None
    built = gemv_shim.build(_writable(user_cache_dir() / "blas") or _temp_blas_dir())
    return str(built) if built is not None and gemv_shim.install(built, openblas) is not None else None


def _temp_blas_dir() -> Path:
    """The per-user temp dir where a read-only home's BLAS files go. Raises nothing."""
    return Path(tempfile.gettempdir()) / f"mlx-tandem-{os.getuid()}" / "blas"


def _writable(directory: Path) -> Path | None:
    """`directory`, created if needed, when this process may write there; else None. Raises nothing."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return directory if os.access(directory, os.W_OK) else None


def _renamed_scipy_openblas() -> Path:
    """Path of the cached unprefixed copy of scipy-openblas32, creating it if needed.

    Raises LookupError when scipy-openblas32 or patchelf is not installed, OSError/CalledProcessError when
    the copy cannot be written or patched.
    """
    source = _scipy_openblas_library()
    version = importlib.metadata.version("scipy-openblas32")
    name = f"libopenblas-tandem-{version}-{source.stat().st_size}.so"
    primary = user_cache_dir() / "blas" / name
    if primary.exists():
        return primary
    try:
        return _write_renamed(source, primary)
    except OSError:
        # A read-only home still gets fast BLAS: fall back to a per-user temp dir.
        fallback = _temp_blas_dir() / name
        return fallback if fallback.exists() else _write_renamed(source, fallback)


def _write_renamed(source: Path, target: Path) -> Path:
    patchelf = _patchelf()
    symbols = _prefixed_symbols(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Patch a private temp copy and rename it into place: concurrent first starts never see a half file.
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".openblas-", suffix=".so")
    map_name = tmp_name + ".map"
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            out.write(src.read())
        with open(map_name, "w", encoding="ascii") as mapping:
            mapping.writelines(f"{s} {s[len(_SCIPY_PREFIX):]}\n" for s in symbols)
        subprocess.run(
            [patchelf, "--rename-dynamic-symbols", map_name, "--set-soname", target.name, tmp_name],
            check=True,
            capture_output=True,
        )
        plain_modes(Path(tmp_name), executable=True)  # mkstemp's 0600 otherwise
        os.replace(tmp_name, target)
    finally:
        for leftover in (tmp_name, map_name):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return target


def _scipy_openblas_library() -> Path:
    # find_spec does not execute the package, whose import would load the prefixed library too.
    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("scipy-openblas32 is not installed")
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    candidates = sorted(lib_dir.glob("libscipy_openblas*.so*"))
    if not candidates:
        raise LookupError(f"no libscipy_openblas in {lib_dir}")
    return candidates[0]


def _patchelf() -> str:
    try:
        dist = importlib.metadata.distribution("patchelf")
        for file in dist.files or ():
            if file.name == "patchelf" and file.parent.name == "bin":
                located = Path(str(dist.locate_file(file))).resolve()
                if located.is_file():
                    return str(located)
    except importlib.metadata.PackageNotFoundError:
        pass
    found = os.path.join(os.path.dirname(sys.executable), "patchelf")
    if os.path.isfile(found):
        return found
    which = shutil.which("patchelf")
    if which is None:
        raise LookupError("patchelf is not installed")
    return which


def _prefixed_symbols(library: Path) -> list[str]:
    """Defined dynamic symbols of an x86-64/aarch64 ELF64 library that carry the scipy_ prefix.

    Raises LookupError when the file is not a little-endian ELF64 object with a dynamic symbol table.
    """
    data = library.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise LookupError(f"{library} is not a little-endian ELF64 library")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynsym = next((s for s in sections if s[1] == 11), None)  # SHT_DYNSYM
    if dynsym is None:
        raise LookupError(f"{library} has no dynamic symbol table")
    strtab = sections[dynsym[6]]
    str_start, str_end = strtab[4], strtab[4] + strtab[5]
    names = []
    for offset in range(dynsym[4], dynsym[4] + dynsym[5], dynsym[9] or 24):
        name_at, _info, _other, shndx = struct.unpack_from("<IBBH", data, offset)
        if shndx == 0:  # undefined: imported, not exported
            continue
        end = data.index(b"\0", str_start + name_at, str_end)
        name = data[str_start + name_at : end].decode("ascii", "replace")
        if name.startswith(_SCIPY_PREFIX):
            names.append(name)
    return names
