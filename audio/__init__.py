"""Speech for mlx-tandem: PCM, VAD, Whisper, live sessions. Knows nothing of HTTP.

Importing audio does no work; like engine/, whoever starts the process loads the fast BLAS first
(`engine.backend.ensure_fast_blas()`) when it will import mlx.
"""

__all__: list[str] = []
