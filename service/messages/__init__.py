"""POST /v1/messages: Anthropic's Messages API (Claude Code, the anthropic SDKs) over the chat machinery."""

__all__: list[str] = []
