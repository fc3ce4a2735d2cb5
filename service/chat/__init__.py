"""Chat and text completions: prompt rendering, request → engine mapping, engine output → OpenAI chunks."""

__all__: list[str] = []
