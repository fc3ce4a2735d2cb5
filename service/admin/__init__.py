"""Admin routes: /v1/models, /health, /stats and /metrics."""

__all__: list[str] = []
