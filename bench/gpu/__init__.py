"""Scripts for the serving benchmark on the lent H200 (see bench/gpu/serve_h200.sh)."""

__all__: list[str] = []
