"""How much one chat or completions request may ask for: each choice is a row, each stop string a match per token."""

from __future__ import annotations

__all__ = ["MAX_CHOICES", "MAX_STOP_STRINGS"]

# Choices in one request (n, and a text completion's prompts times n): each is a row, and one request must not take
# the whole queue.
MAX_CHOICES = 64
# Stop strings a request may give. OpenAI takes 4, vLLM and llama.cpp any number; FIM clients (Continue: a template's
# special tokens, blank lines, a language's keywords, the user's own) send 14-20. Each is matched on every token.
MAX_STOP_STRINGS = 64
