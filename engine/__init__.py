"""Model work for mlx-tandem: the cooperative driver, LLM batching, prefix cache. Knows nothing of HTTP.

Importing engine does no work. On Linux CPU an optimised BLAS must be loaded before anything imports mlx:
entry points (the `tandem` CLI, the server's worker, the benchmarks, the tests) call
`engine.backend.ensure_fast_blas()` first.
"""

__all__: list[str] = []
