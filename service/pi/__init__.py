"""The pi coding agent against mlx-tandem: the provider route, pi's config files, and `tandem pi`."""

__all__: list[str] = []
