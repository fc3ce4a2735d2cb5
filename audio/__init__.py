"""Speech for mlx-tandem: PCM, VAD, Whisper, live sessions. Knows nothing of HTTP."""

# engine loads the optimised CPU BLAS; it must be in place before anything here imports mlx.
import engine as _engine  # noqa: F401

__all__: list[str] = []
