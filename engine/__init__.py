"""Model work for mlx-tandem: the cooperative driver, LLM batching, prefix cache. Knows nothing of HTTP."""
