"""Pydantic models of chat and text completion requests (OpenAI's shapes) — the OpenAPI source for the
/v1/*completions bodies; the replies are service/chat/replies.py.

Every field a request carries is honoured or refused with a 400 naming it, never silently ignored: an unknown
top-level field is refused as OpenAI refuses it ("Unrecognized request argument supplied"), a nested object may
carry unknown fields only while they are empty (the SDK's own message objects echo `refusal: null`,
`annotations: []`), and a known field's values that cannot be honoured (n > 1, JSON output, a forced tool
choice, stored completions) are refused by name. OpenAI's legacy function calling (`functions`, `function_call`,
`role: "function"`) is taken as tools (service/chat/legacy_functions.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from service.chat.json_output import check_response_format
from service.chat.message_parts import (CACHE_BREAKPOINT, UNREAD_PARTS, CacheControl, ContentPart, RefusalPart,
                                        TextPart, unread_parts_refused)
from service.chat.metadata import metadata_limits
from service.chat.prefill import continued_message, generation_prompt_asked
from service.chat.request_limits import MAX_CHOICES, MAX_STOP_STRINGS
from service.chat.strict_body import _Body, _Request, _empty, _only_false
from service.chat.structured_outputs import StructuredOutputFields
from service.chat.thinking_switch import (AskedThinking, ThinkingSwitch, asked_thinking, kwargs_agree,
                                         reasoning_format_taken, switch_agrees)
from service.chat.tool_results import tool_message_content
from service.chat.tool_schemas import (TOOL_NAME, ChosenFunction, FunctionCall, FunctionDefinition, NamedToolChoice,
                                       Tool, ToolCall, choice_needs_tools, function_call_chosen,
                                       functions_not_beside_tools, no_forced_call)
from service.chat.cache_retention import CacheRetention, retention_alias
from service.chat.verbosity import verbosity_validator
from service.chat.vllm_fields import min_tokens_within_max, no_top_k

__all__ = [
    "TextPart",
    "RefusalPart",
    "FunctionCall",
    "ToolCall",
    "ChatMessage",
    "StreamOptions",
    "FunctionDefinition",
    "Tool",
    "SamplingFields",
    "ChatCompletionRequest",
    "no_forced_call",
    "unread_parts_refused",
    "UNREAD_PARTS",
    "TOOL_NAME",
]


class ChatMessage(_Request):
    """One conversation message. `developer` is treated as `system` when the prompt is built, `function` (legacy)
    as a tool result (service/chat/legacy_functions.py)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # Before content, whose check reads them: an assistant message may leave content null only beside calls.
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = Field(None, description="OpenAI's legacy call (beside `functions`): one "
                                                                 "tool call, its id made up.")
    content: str | list[ContentPart] | None = Field(None, validate_default=True)
    name: str | None = Field(None, validate_default=True)
    tool_call_id: str | None = Field(None, validate_default=True)
    # Prior assistant thinking, passed back to the chat template.
    reasoning_content: str | None = None
    reasoning: str | None = None
    cache_control: CacheControl | None = None
    cache_breakpoint: bool | None = Field(None, description=CACHE_BREAKPOINT)

    @field_validator("content", mode="before")
    @classmethod
    def _readable_parts(cls, content: Any, info: ValidationInfo) -> Any:
        returned = info.data.get("role") in ("tool", "function")
        return tool_message_content(content) if returned else unread_parts_refused(content)

    @field_validator("function_call")
    @classmethod
    def _one_kind_of_call(cls, call: FunctionCall | None, info: ValidationInfo) -> FunctionCall | None:
        if call is not None and info.data.get("role") != "assistant":
            raise ValueError("only an assistant message carries a function_call")
        if call is not None and info.data.get("tool_calls"):
            raise ValueError("give tool_calls or the legacy function_call, not both")
        return call

    @field_validator("content")
    @classmethod
    def _has_content(cls, content: Any, info: ValidationInfo) -> Any:
        # As OpenAI refuses them: a message with nothing to say (a function's result may be null, as OpenAI's type).
        role = info.data.get("role")
        if content is None and role == "assistant" and not (info.data.get("tool_calls") or
                                                            info.data.get("function_call")):
            raise ValueError("an assistant message needs content or tool_calls")
        if content is None and role not in (None, "assistant", "function"):
            raise ValueError(f"a {role} message needs content")
        if isinstance(content, list) and not content:
            raise ValueError("an empty array; give at least one content part")
        return content

    @field_validator("name")
    @classmethod
    def _names_its_function(cls, name: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("role") == "function" and not name:  # the call it answers is the one of that name
            raise ValueError("a function message names the function whose result it is")
        return name

    @field_validator("tool_call_id")
    @classmethod
    def _names_its_call(cls, tool_call_id: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("role") == "tool" and not tool_call_id:
            raise ValueError("a tool message names the call it answers")
        return tool_call_id

    def text(self) -> str:
        """The content as one string (parts joined). Raises nothing."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text if isinstance(part, TextPart) else part.refusal for part in self.content)


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool | None = Field(
        None, description="vLLM's: with include_usage, every chunk carries its choice's usage so far (prompt and "
                          "reply tokens), the usage chunk still last; without include_usage, nothing (as vLLM).")
    include_obfuscation: bool | None = Field(None, description="Only false: chunks are not padded.")

    @field_validator("include_obfuscation")
    @classmethod
    def _no_obfuscation(cls, value: bool | None) -> bool | None:
        return _only_false(value, "chunks are never padded here: only false is supported")


class SamplingFields(_Body):
    """Fields shared by chat and text completions."""

    model: str | None = Field(None, description="Model id from GET /v1/models; omitted means the loaded model.")
    stream: bool | None = Field(False, description="null: false.")
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="The newer name of max_tokens; beside it, "
                                                                    "the reply stops at the smaller.")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0, description="0: only the likeliest token (greedy).")
    top_k: int | None = Field(None, ge=-1, description="0 or -1 (vLLM's and SGLang's): no top-k.")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    # OpenAI's range (a signed 64-bit integer): wider seeds wrapped onto the same draws as others.
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    repetition_context_size: int | None = Field(
        None, ge=0, description="mlx_lm.server's: repetition_penalty counts only the last N tokens of prompt + reply "
                                "(0: all of them); left out, the whole prompt and reply.")
    presence_context_size: int | None = Field(
        None, ge=0, description="mlx_lm.server's: presence_penalty counts only the last N tokens of prompt + reply "
                                "(0: all of them); left out, the whole reply (OpenAI's).")
    frequency_context_size: int | None = Field(
        None, ge=0, description="mlx_lm.server's: frequency_penalty counts only the last N tokens of prompt + reply "
                                "(0: all of them); left out, the whole reply (OpenAI's).")
    xtc_probability: float | None = Field(
        None, ge=0.0, le=1.0, description="mlx_lm.server's XTC: how often a draw drops the tokens likelier than "
                                          "xtc_threshold but the least likely of them (never a newline or end of text; "
                                          "sampled replies only). Default 0: never.")
    xtc_threshold: float | None = Field(None, ge=0.0, le=1.0, description="XTC's threshold (default 0.1); at most 0.5 "
                                                                        "where XTC applies, as mlx-lm's sampler.")
    logit_bias: dict[str, float] | None = Field(None, description="Token id (as a string) → bias in [-100, 100].")
    n: int | None = Field(1, description=f"Choices to generate, each its own row (null: 1; at most {MAX_CHOICES} in "
                                         "a request); with a seed, sample j gets the seed + j.")
    user: str | None = Field(None, description="An end-user id: written on the request's access-log line.")
    safety_identifier: str | None = Field(None, description="As `user`.")
    metadata: dict[str, str] | None = Field(None, description="Tags: at most 16 pairs, keys of at most 64 characters, "
                                                              "values of at most 512; written on the request's "
                                                              "access-log line (no completions are stored).")
    skip_special_tokens: bool | None = Field(None, description="vLLM's field: false keeps the special tokens a model "
                                             "writes mid-reply in its text (default: left out, as vLLM does).")
    # vLLM's SamplingParams, as its clients (SillyTavern's "vLLM" text completion type) send them by default.
    min_tokens: int | None = Field(None, ge=0, description="vLLM's: no end-of-sequence or stop token is sampled, and "
                                   "no stop string ends the reply, before this many tokens; at most max_tokens. "
                                   "Not with JSON output, a forced call or a strict function.")
    ignore_eos: bool | None = Field(None, description="vLLM's: true: the model's end-of-sequence tokens do not end the "
                                    "reply (max_tokens and stop strings do); their text follows skip_special_tokens. "
                                    "Not with JSON output, a forced call or a strict function.")
    spaces_between_special_tokens: bool | None = Field(
        None, description="vLLM's: either value gives the same text: special tokens kept in it (skip_special_tokens "
                          "false) are written as they are, no space added between them (vLLM's false; under its true, "
                          "a byte-level tokenizer's text too).")

    _min_tokens = field_validator("min_tokens")(min_tokens_within_max)
    _metadata = field_validator("metadata")(metadata_limits)
    _top_k = field_validator("top_k")(no_top_k)

    @field_validator("stream_options")
    @classmethod
    def _only_streamed(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("only allowed when stream is true")
        return options

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int | None) -> int | None:
        if n is not None and not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"n must be 1 to {MAX_CHOICES}")
        return n

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            # ASCII digits only ("٣" is a digit to Python) and no longer than any vocabulary's ids.
            if not (key.isascii() and key.isdigit()) or len(key) > 10:
                raise ValueError(f"logit_bias keys must be token ids, got {key[:40]!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {value}")
        return bias

    def reply_limit(self) -> int | None:
        """The reply's limit asked: the smaller of max_tokens and max_completion_tokens (aiperf sends both, each an
        upper bound), None when neither is given. Raises nothing."""
        return min((v for v in (self.max_tokens, self.max_completion_tokens) if v is not None), default=None)

    def usage_every_chunk(self) -> bool:
        """Whether each streamed chunk carries its usage so far: continuous_usage_stats beside include_usage (vLLM
        ignores it alone). Raises nothing."""
        options = self.stream_options
        return bool(options and options.include_usage and options.continuous_usage_stats)

    def stop_list(self) -> list[str]:
        """`stop` as a list without empty strings. Raises nothing."""
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s]


class ChatCompletionRequest(StructuredOutputFields, SamplingFields):
    """POST /v1/chat/completions body (vLLM's structured outputs after the sampling fields)."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    tools: list[Tool] | None = None
    # OpenAI's legacy function calling, between the fields whose checks read it (service/chat/legacy_functions.py).
    functions: list[FunctionDefinition] | None = Field(
        None, description="OpenAI's legacy (deprecated) tools: taken as `tools` of these functions, and the reply's "
                          "call comes as `message.function_call` (finish_reason \"function_call\"), one at most. Not "
                          "beside tools.")
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = Field(
        None, description='"auto" (the default with tools), "none" (the tools are not shown to the model and its reply '
                          'is all content), or a forced call ("required", or a named function: the reply is calls, '
                          'enforced token by token, for models whose calls are <tool_call> JSON; a 400 for others).')
    function_call: Literal["none", "auto"] | ChosenFunction | None = Field(
        None, description='The legacy tool_choice, with functions: "none", "auto", or {"name": ...}, a forced call of '
                          'that function. Not beside tool_choice.')
    parallel_tool_calls: bool | None = Field(None, description="false: the reply ends after its first tool call.")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Variables passed to the model's chat template as they are.")
    reasoning_effort: str | None = Field(
        None, description='"none" switches thinking off; any other value passes to a template that reads '
                          '`reasoning_effort` or switches thinking on where it reads `enable_thinking`. Refused '
                          'for a template with neither.')
    # vLLM's and SGLang's switch (service/chat/thinking_switch.py), after the fields it must agree with.
    enable_thinking: bool | None = Field(
        None, description="vLLM's and SGLang's: false is reasoning_effort \"none\", true thinking on at the "
                          "template's own effort (as chat_template_kwargs' enable_thinking); refused beside a "
                          "reasoning_effort or chat_template_kwargs enable_thinking or thinking that disagrees.")
    thinking: ThinkingSwitch | None = Field(
        None, description='{"type": "enabled" | "disabled"}: as enable_thinking true / false (DeepSeek\'s, GLM\'s '
                          'shape); refused beside a field that disagrees.')
    reasoning_format: str | None = Field(
        None, description='llama.cpp\'s and SGLang\'s: "auto" or "deepseek" (the thinking in reasoning_content, as '
                          'always here); "none" and "deepseek-legacy", which leave it in content, are refused.')
    response_format: dict[str, Any] | None = Field(
        None, description='{"type": "json_schema", "json_schema": {"name", "schema", "strict"}} or {"type": '
                          '"json_object"}: the reply follows the schema (any JSON object), enforced token by token '
                          '(after a thinking block); beside tools a call may come instead. {"type": "text"}: free '
                          'text. TGI\'s grammars too: {"type": "json" or "json_object", "value": a JSON Schema}, '
                          '{"type": "regex", "value": a pattern the whole reply matches}.')
    store: bool | None = Field(None, description="Only false: this server keeps no completions.")
    verbosity: Literal["medium"] | None = Field(None, description="Only medium: replies are as long as the model "
                                                                  "makes them.")
    prompt_cache_key: str | None = Field(None, description="Which cached prefix to continue (a hint; results are "
                                                           "the same either way).")
    prompt_cache_retention: CacheRetention | None = Field(
        None, description="Accepted (\"in-memory\" as \"in_memory\"): cached prefixes stay in memory while the memory "
                          "budget has room for them.")
    service_tier: Literal["auto", "default"] | None = Field(None, description="This server has one tier.")
    modalities: list[Literal["text"]] | None = Field(None, description='Only ["text"].')
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # vLLM's prefill switches (service/chat/prefill.py); add_generation_prompt after the field its check reads.
    continue_final_message: bool | None = Field(
        False, description="true: the reply continues the last message, the assistant's (a prefill): the prompt ends "
                           "with its text, the reply is the continuation alone.")
    add_generation_prompt: bool | None = Field(
        None, description="vLLM's: true by default, false with continue_final_message (true beside it is refused); "
                          "false alone is refused.")

    # OpenAI fields this server has nothing to honour with: null (or empty) passes, as it asks for nothing. Not
    # web_search_options: its `{}` asks for a search with default settings.
    audio: dict[str, Any] | None = Field(None, description="Only null: replies are text.")
    prediction: dict[str, Any] | None = Field(None, description="Only null: no predicted outputs.")
    web_search_options: dict[str, Any] | None = Field(None, description="Only null: no web search ({} asks for one).")

    @field_validator("audio", "prediction")
    @classmethod
    def _nothing_asked(cls, value: Any) -> Any:
        if not _empty(value):
            raise ValueError("not supported by this server (only null)")
        return value

    @field_validator("web_search_options")
    @classmethod
    def _no_web_search(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            raise ValueError("not supported by this server: no web search is offered (only null; an empty object "
                             "asks for a search with default settings)")
        return value

    _reasoning_format = field_validator("reasoning_format")(reasoning_format_taken)

    @field_validator("reasoning_effort")
    @classmethod
    def _effort_agrees(cls, value: str | None, info: ValidationInfo) -> str | None:
        # beside chat_template_kwargs' switch: one that disagrees won silently (the template read the kwarg)
        if value is not None:
            kwargs_agree(f"reasoning_effort {value!r}", value != "none", info.data.get("chat_template_kwargs") or {})
        return value

    @field_validator("enable_thinking")
    @classmethod
    def _enable_agrees(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value is not None:
            switch_agrees("enable_thinking", str(value).lower(), value, info)
        return value

    @field_validator("thinking")
    @classmethod
    def _thinking_agrees(cls, value: ThinkingSwitch | None, info: ValidationInfo) -> ThinkingSwitch | None:
        if value is not None:
            switch_agrees("thinking", f"type {value.type!r}", value.type == "enabled", info)
        return value

    def asked_thinking(self) -> AskedThinking | None:
        """What the request asks of the model's thinking (reasoning_effort, enable_thinking or thinking), and the
        field that asked; None when none is set. Raises nothing."""
        return asked_thinking(self.reasoning_effort, self.enable_thinking, self.thinking)

    _no_forced_call = field_validator("tool_choice", mode="before")(no_forced_call)
    _verbosity = field_validator("verbosity", mode="before")(verbosity_validator("a system message"))
    _retention = field_validator("prompt_cache_retention", mode="before")(retention_alias)
    _continued = field_validator("continue_final_message")(continued_message)
    _generation_prompt = field_validator("add_generation_prompt")(generation_prompt_asked)
    _functions_alone = field_validator("functions")(functions_not_beside_tools)
    _needs_tools = field_validator("tool_choice", "parallel_tool_calls")(choice_needs_tools)
    _chooses_a_function = field_validator("function_call")(function_call_chosen)

    @model_validator(mode="after")
    def _functions_as_tools(self) -> "ChatCompletionRequest":
        # One tool mechanism: the legacy fields are tools and tool_choice from here on; `functions` stays set, for
        # the reply's legacy shape (legacy_reply).
        if self.functions is not None:
            self.tools = [Tool(function=f) for f in self.functions]
            if isinstance(self.function_call, ChosenFunction):
                self.tool_choice = NamedToolChoice(function=self.function_call)
            elif self.function_call is not None:
                self.tool_choice = self.function_call
        return self

    def legacy_reply(self) -> bool:
        """Whether the reply's call comes in OpenAI's legacy shape (`message.function_call`, finish_reason
        "function_call", one call at most): the request gave `functions`. Raises nothing."""
        return self.functions is not None

    @field_validator("response_format", mode="before")
    @classmethod
    def _json_format(cls, value: Any) -> Any:
        return check_response_format(value)

    @field_validator("store")
    @classmethod
    def _not_stored(cls, store: bool | None) -> bool | None:
        return _only_false(store, "this server keeps no completions: only false is supported")
