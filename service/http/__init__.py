"""What every route shares: OpenAI-shaped errors and their table, SSE framing, OpenAPI helpers."""

__all__: list[str] = []
