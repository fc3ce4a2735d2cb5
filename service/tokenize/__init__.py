"""vLLM's tokenizer routes (/tokenize, /detokenize, /tokenizer_info): evaluation harnesses count and split prompts
with the served model's own tokenizer through them (lm-eval's `local-completions` looks for them first)."""

__all__: list[str] = []
