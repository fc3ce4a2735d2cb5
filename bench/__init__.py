"""Benchmarks for mlx-tandem against its peers on the same machine, same run (`tandem benchmark`)."""

__all__: list[str] = []
