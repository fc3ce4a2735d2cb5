"""Model work for mlx-tandem: the cooperative driver, LLM batching, prefix cache. Knows nothing of HTTP."""

# Must run before anything imports mlx: an optimised BLAS only wins when loaded first (engine/backend.py).
from engine.backend import ensure_fast_blas as _ensure_fast_blas

_ensure_fast_blas()

__all__: list[str] = []
