"""Chat prompts rendered with limits, one at a time on the tokenizer's turn.

- A client may not supply a template (`chat_template_kwargs.chat_template`) unless the server allows it,
  nor override apply_chat_template's own arguments through the template variables.
- Text that cannot fit the context is refused before any rendering or tokenization: no token is longer
  than the vocabulary's longest entry, so more characters than context × that length never fit.
- The server's template renders in a worker thread that is aborted at `render_timeout` or as soon as the
  client leaves (service/abortable.py); its output is size-checked before it is tokenized.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

import anyio

from engine.harmony import is_harmony
from engine.per_tokenizer import PerTokenizer
from engine.think_markers import fallback_think_markers
from engine.tool_formats import GRANITE_START, fallback_tool_format
from service.abortable import run_abortable
from service.chat.call_ids import wants_nine_char_ids, with_nine_char_ids
from service.chat.content_parts import as_text_parts, reads_text_parts, reads_thinking_parts, with_thinking_parts
from service.chat.legacy_functions import with_legacy_calls
from service.chat.prefill import continued_opening
from service.chat.prompt import (
    MessageError,
    NotReasoning,
    common_prefix_boundary,
    encode_rendered,
    generation_prompt,
    has_chat_template,
    named_roles,
    reads_tool_calls,
    render_text,
    results_in_call_order,
    system_probe,
    takes_tools,
    template_kwargs,
    template_messages,
    template_source,
    template_variables,
)
from service.chat.prompt_limit import PromptTooLong, usable_context
from service.chat.schemas import ChatCompletionRequest
from service.chat.tool_text import calls_as_text, request_tools, with_tool_prompt
from service.http.errors import APIError
from service.seams import ChatEngine
from service.state import AppState

__all__ = ["RenderedPrompt", "render_chat", "check_template_kwargs", "request_kwargs", "request_messages", "char_bound",
           "check_text_fits", "TEMPLATE_KWARGS", "RESERVED_KWARGS", "QUOTED_CHARS"]

# Template variables that carry a template of their own.
TEMPLATE_KWARGS = frozenset({"chat_template"})
# apply_chat_template's own arguments: not template variables, never taken from a request.
RESERVED_KWARGS = frozenset({
    "tools", "documents", "add_generation_prompt", "continue_final_message", "tokenize", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "processor_kwargs", "messages", "conversation",
})


@dataclass(frozen=True)
class _Traits:
    """What a tokenizer's chat template needs of the messages, read once from its text."""

    reads_calls: bool  # it renders `tool_calls` (else calls and results go in as text)
    list_marker: str | None  # earlier calls go back as this marker and a JSON list (Granite's)
    reads_thinking: bool  # earlier reasoning as a `thinking` chunk (Mistral's reasoning templates)
    reads_parts: bool  # content as a list of parts (early Gemma 3)
    nine_char_ids: bool  # tool-call ids of nine alphanumerics (Mistral)


def _traits(tokenizer: Any) -> _Traits:
    sources, found = template_source(tokenizer), fallback_tool_format(tokenizer)
    return _Traits(reads_calls=reads_tool_calls(tokenizer),
                   list_marker=GRANITE_START if found is not None and found.start == GRANITE_START else None,
                   reads_thinking=reads_thinking_parts(sources), reads_parts=reads_text_parts(sources),
                   nine_char_ids=wants_nine_char_ids(sources))


_VARIABLES = PerTokenizer(template_variables)
_TRAITS = PerTokenizer(_traits)
# Templates that write a tool's description: Hermes' `tool.description` failed on a tool without one (optional in
# OpenAI's API), gpt-oss's `"// " + tool.description` too.
_WRITES_DESCRIPTIONS = PerTokenizer(lambda tokenizer: is_harmony(tokenizer) or any(
    "description" in text for text in template_source(tokenizer) or ()))
_NAMED_ROLES = PerTokenizer(named_roles)
# Each tokenizer's generation prompt per set of template kwargs (a request's kwargs may vary; the newest kept).
_OPENINGS: PerTokenizer[dict[str, str | None]] = PerTokenizer(lambda tokenizer: {})
_OPENINGS_KEPT = 32


@dataclass(frozen=True)
class RenderedPrompt:
    """A chat prompt's token ids and the prefix-cache boundary after its system block (if any)."""

    tokens: list[int]
    boundaries: tuple[int, ...]
    # The tools were described in the system message (the template takes none): calls come as <tool_call> JSON.
    json_tool_calls: bool = False
    # What the template appended to open the reply (None: not known), so that only it, never the conversation,
    # decides whether the reply starts inside a think block; for a continued message, what the reply continues
    # (service/chat/prefill.py continued_opening).
    generation_prompt: str | None = None


def check_template_kwargs(kwargs: dict[str, Any], allow_templates: bool) -> None:
    """Raises APIError 400 naming the chat_template_kwargs field a request may not set. (A variable the template
    does not read is passed all the same: pi sends `preserve_thinking` to every Qwen-style template.)"""
    for key in kwargs:
        if key in TEMPLATE_KWARGS and not allow_templates:
            raise APIError(400, f"chat_template_kwargs.{key}: this server renders only its own chat template "
                                "(start it with --allow-request-templates to accept one)",
                           param=f"chat_template_kwargs.{key}", code="request_templates_disabled")
        if key in RESERVED_KWARGS:
            raise APIError(400, f"chat_template_kwargs.{key} is set by the server, not by a request",
                           param=f"chat_template_kwargs.{key}", code="invalid_value")


def request_messages(tokenizer: Any, body: ChatCompletionRequest, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages for the template: legacy function calls and results as tool calls and results,
    speaker names the template does not write put in the text, tool results in the order of the calls they answer.
    Raises APIError 400 naming the message field OpenAI refuses (a tool or function result that answers no call of
    the assistant message before it, a call left without a result)."""
    named = None
    try:
        given = with_legacy_calls(body.messages)  # OpenAI's legacy function calls and results, as tool messages
        # A client's own template reads what it reads; the server's is probed (a render) only once a name comes.
        if "chat_template" not in kwargs and any(m.name and m.role != "tool" for m in given):
            named = _NAMED_ROLES.get(tokenizer)
        return results_in_call_order(template_messages(given, named))
    except MessageError as exc:
        raise APIError(400, str(exc), param=exc.param, code="invalid_value") from None


def _thinks(tokenizer: Any) -> bool:
    # mlx-lm's markers, or ones it does not know (Magistral's [THINK]: engine/think_markers.py)
    return bool(getattr(tokenizer, "think_start", None) and getattr(tokenizer, "think_end", None)) \
        or fallback_think_markers(tokenizer) is not None


# The efforts gpt-oss's template and training know ("Reasoning: low"); any other is written into its prompt as is.
_HARMONY_EFFORTS = ("low", "medium", "high")


def request_kwargs(tokenizer: Any, body: ChatCompletionRequest, allow_templates: bool,
                   defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The template variables a request sets, over the server's `defaults` (--chat-template-args). Raises
    APIError 400 naming the field (chat_template_kwargs.KEY, reasoning_effort, enable_thinking, thinking.type) that
    cannot be honoured."""
    variables = _VARIABLES.get(tokenizer)
    given = body.chat_template_kwargs or {}
    asked = body.asked_thinking()
    if not has_chat_template(tokenizer) and "chat_template" not in given:
        # Plain "role: content" lines read no variable: what would set one is refused, not dropped.
        if given:
            key = next(iter(given))
            raise APIError(400, f"chat_template_kwargs.{key}: this model has no chat template to read it",
                           param=f"chat_template_kwargs.{key}", code="invalid_value")
        if asked is not None:
            raise APIError(400, f"{asked.field}: this model has no chat template to set it in",
                           param=asked.field, code="unsupported_value")
    # thinking on without an effort is gpt-oss's own (medium); off is not to be had
    effort = asked.effort if asked is not None else None
    if asked is not None and effort is not None and effort not in _HARMONY_EFFORTS and is_harmony(tokenizer):
        why = (f"gpt-oss reasons at low, medium or high effort, not {effort!r}" if asked.field == "reasoning_effort"
               else "gpt-oss always reasons: its thinking cannot be switched off")
        raise APIError(400, f"{asked.field}: {why}", param=asked.field, code="unsupported_value")
    try:
        kwargs = template_kwargs(body, variables, _thinks(tokenizer))
    except ValueError as exc:
        # OpenAI's codes: a model without reasoning has no such parameter; one that reasons lacks the value
        code = "unsupported_parameter" if isinstance(exc, NotReasoning) else "unsupported_value"
        raise APIError(400, str(exc), param=asked.field if asked else None, code=code) from None
    check_template_kwargs(kwargs, allow_templates)
    return {**(defaults or {}), **kwargs}


def _longest_token_of(tokenizer: Any) -> int | None:
    get_vocab = getattr(tokenizer, "get_vocab", None)
    try:
        vocab = get_vocab() if callable(get_vocab) else None
        longest = max((len(piece) for piece in vocab), default=0) if vocab else 0
    except Exception:  # noqa: BLE001 — a tokenizer that cannot list its vocabulary gets no bound
        return None
    return longest if longest > 0 else None


_LONGEST = PerTokenizer(_longest_token_of)


def char_bound(engine: ChatEngine) -> int | None:
    """Most characters a prompt can have and still fit the context (None: unknown). Raises nothing."""
    sizes = _sizes(engine)
    return None if sizes is None else sizes[0] * sizes[1]


def _sizes(engine: ChatEngine) -> tuple[int, int] | None:
    """The context in tokens and the most characters one token covers (None: either unknown): vocabulary entries are
    written one character per byte or longer, so no token covers more than the longest entry's length. Raises
    nothing."""
    context = engine.context_length
    longest = _LONGEST.get(engine.tokenizer) if engine.tokenizer is not None else None
    if not isinstance(context, int) or context <= 0 or longest is None:
        return None
    return context, longest


def check_text_fits(chars: int, engine: ChatEngine, param: str) -> None:
    """Raises PromptTooLong (400 context_length_exceeded) when `chars` characters cannot fit the context, naming the
    lower limit where the memory budget holds less."""
    sizes, limit = _sizes(engine), usable_context(engine)
    if sizes is not None and limit is not None and chars > sizes[0] * sizes[1]:
        context, longest = sizes  # the fewest tokens the text makes: more than the context holds
        raise PromptTooLong(-(-chars // longest), limit, context, param, chars=chars)


def _content_chars(messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    size = sum(len(str(m.get("content") or "")) for m in messages)
    return size + (len(json.dumps(tools)) if tools else 0)


async def render_chat(state: AppState, engine: ChatEngine, body: ChatCompletionRequest) -> RenderedPrompt:
    """The request's prompt, rendered and tokenized within the limits (module docstring). Cancelling the
    caller aborts the rendering.

    Raises APIError 400: a refused template kwarg, tool results that do not answer their calls (invalid_value),
    text that cannot fit (context_length_exceeded), a template that rejects the messages (invalid_messages) or
    takes longer than render_timeout."""
    tokenizer = engine.tokenizer
    tools = request_tools(body)
    if tools and _WRITES_DESCRIPTIONS.get(tokenizer):
        tools = [dict(t, function={"description": "", **t["function"]}) if "function" in t else t for t in tools]
    kwargs = request_kwargs(tokenizer, body, state.config.allow_request_templates, state.config.chat_template_args)
    messages = request_messages(tokenizer, body, kwargs)
    traits = _TRAITS.get(tokenizer)
    described = bool(tools) and not takes_tools(tokenizer, _VARIABLES.get(tokenizer))  # tools told in our own words
    if (not traits.reads_calls or described) and any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        # else the template drops the calls and their results say nothing, or (tools in our words) writes them in
        # its own format, unlike what the model is told to write: R1's drops the calls of a turn that has text too
        messages = calls_as_text(messages, traits.list_marker)
    elif traits.nine_char_ids:
        messages = with_nine_char_ids(messages)  # Mistral's templates refuse the ids OpenAI and this server issue
    json_calls, user_turn_tools = False, None
    if described and tools:
        if not messages or messages[0]["role"] != "system":
            # The system turn is ours: should the template refuse it, the tools open the first user turn instead.
            user_turn_tools = with_tool_prompt(messages, tools, in_user_turn=True)
        messages, tools, json_calls = with_tool_prompt(messages, tools), None, True
    check_text_fits(_content_chars(messages, tools), engine, "messages")
    timeout, continued = state.config.limits.render_timeout, bool(body.continue_final_message)
    async with state.tokenize_limiter or anyio.CapacityLimiter(1):
        try:
            text, special = await _render(tokenizer, messages, tools, kwargs, timeout, continued)
        except APIError as exc:
            if user_turn_tools is None or exc.code != "invalid_messages":
                raise
            messages = user_turn_tools  # what the template rejects now is the client's own
            text, special = await _render(tokenizer, messages, tools, kwargs, timeout, continued)
        check_text_fits(len(text), engine, "messages")
        # Encoding is not aborted midway (a fast tokenizer keeps state across it); the text is bounded.
        tokens = await anyio.to_thread.run_sync(encode_rendered, tokenizer, text, special)
        boundaries: tuple[int, ...] = ()
        if (probe := system_probe(messages)) and not special:
            try:
                probe_text, _ = await _render(tokenizer, probe, tools, kwargs, timeout)
                probe_tokens = await anyio.to_thread.run_sync(encode_rendered, tokenizer, probe_text, False)
                boundaries = common_prefix_boundary(probe_tokens, tokens)
            except APIError:  # a template that insists on a full conversation: no boundary, no harm
                pass
        if continued:
            return RenderedPrompt(tokens, boundaries, json_calls,
                                  continued_opening(tokenizer, text, str(messages[-1]["content"] or "")))
        opening = await _opening(tokenizer, kwargs, timeout)
    return RenderedPrompt(tokens, boundaries, json_calls, opening if opening is not None and text.endswith(opening)
                          else None)


async def _opening(tokenizer: Any, kwargs: dict[str, Any], timeout: float) -> str | None:
    """generation_prompt(tokenizer, kwargs), kept per tokenizer and kwargs; None when it cannot be had in
    `timeout`. Raises nothing but cancellation."""
    kept = _OPENINGS.get(tokenizer)
    key = json.dumps(kwargs, sort_keys=True, default=repr)
    if key not in kept:
        try:
            opening = await run_abortable(generation_prompt, tokenizer, kwargs, timeout=timeout)
        except Exception:  # noqa: BLE001 — a slow template: not known, the token rule decides
            return None
        while len(kept) >= _OPENINGS_KEPT:
            kept.pop(next(iter(kept)))
        kept[key] = opening
    return kept[key]


async def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  kwargs: dict[str, Any], timeout: float, continued: bool = False) -> tuple[str, bool]:
    traits = _TRAITS.get(tokenizer)
    if traits.reads_thinking:
        messages = with_thinking_parts(messages)
    if traits.reads_parts:
        messages = as_text_parts(messages)
    try:
        return await run_abortable(partial(render_text, continued=continued), tokenizer, messages, tools, kwargs,
                                   timeout=timeout)
    except TimeoutError:
        raise APIError(400, f"The chat template did not render these messages within {timeout:g} s.",
                       param="messages", code="render_timeout") from None
    except Exception as exc:  # jinja TemplateError, a template's raise_exception, a bad kwarg
        raise APIError(400, f"The chat template rejected these messages: {_quoted(exc)}", param="messages",
                       code="invalid_messages") from exc


# The most of a template's exception text an error quotes: transformers' prefill error ends with the whole rendered
# chat ("Rendered chat: ..."), and a template's raise_exception may quote a message, either as long as the prompt.
QUOTED_CHARS = 500


def _quoted(exc: BaseException) -> str:
    """`exc`'s text, cut to QUOTED_CHARS with a note saying so. Raises nothing."""
    text = str(exc)
    if len(text) <= QUOTED_CHARS:
        return text
    return f"{text[:QUOTED_CHARS]}… (cut here: {len(text) - QUOTED_CHARS:,} more characters of the template's error)"
