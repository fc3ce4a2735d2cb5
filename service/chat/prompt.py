"""Chat prompt rendering — one implementation for the server, `tandem generate` and bench/agent_turns.py.

OpenAI messages become the dicts chat templates expect; the template (or, for a tokenizer without one,
mlx-lm's plain "role: content" lines) turns them into token ids with the generation prompt appended.
`system_prefix_end` finds where the system prompt ends in those ids: a prefix-cache segment boundary.
"""

from __future__ import annotations

from typing import Any, Collection, Sequence

from service.chat.schemas import ChatCompletionRequest, ChatMessage
from service.chat.tool_text import call_arguments, with_tool_prompt

__all__ = [
    "has_chat_template",
    "generation_prompt",
    "PROBE_TEXT",
    "MessageError",
    "NotReasoning",
    "template_messages",
    "named_roles",
    "results_in_call_order",
    "template_kwargs",
    "template_variables",
    "takes_tools",
    "template_source",
    "reads_tool_calls",
    "render_text",
    "encode_rendered",
    "render_prompt",
    "system_prefix_end",
    "common_prefix_boundary",
    "system_probe",
]


def has_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer renders conversations with a template (mlx-lm's TokenizerWrapper says so;
    a bare HF tokenizer has one when `chat_template` is set). Raises nothing."""
    flag = getattr(tokenizer, "has_chat_template", None)
    if flag is None:
        flag = bool(getattr(tokenizer, "chat_template", None))
    return bool(flag)


class MessageError(ValueError):
    """A conversation OpenAI refuses; `param` names the field (`messages.N.…`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def template_messages(messages: Sequence[ChatMessage],
                      named_roles: Collection[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI messages → the dicts chat templates expect (`developer` → `system`, parts joined,
    tool-call arguments as objects, prior thinking under `reasoning_content` and `thinking`). `named_roles`: the
    roles whose `name` the template writes (`named_roles()`; None: every role's); another role's speaker name
    opens its text ("alice: hi"). A tool's `name` (its function's) is never written: results pair with calls by
    id. Raises nothing."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, text = "system" if message.role == "developer" else message.role, message.text()
        if message.name and text and role != "tool" and named_roles is not None and role not in named_roles:
            # As multi-speaker chat logs put it, so the model still sees who said what.
            text = f"{message.name}: {text}"
        item: dict[str, Any] = {"role": role, "content": text}
        if message.name:
            item["name"] = message.name
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call_arguments(call.function.arguments)},
                }
                for call in message.tool_calls
            ]
        if reasoning := (message.reasoning_content or message.reasoning):
            # Qwen-style templates read `reasoning_content`; gpt-oss's (harmony) reads `thinking`.
            item["reasoning_content"] = item["thinking"] = reasoning
        out.append(item)
    return out


def results_in_call_order(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation (`template_messages`' dicts) with each run of tool results in the order of the calls they
    answer: OpenAI pairs them by `tool_call_id`, templates and <tool_response> blocks by position.

    Raises MessageError where OpenAI refuses the conversation: a tool message that answers no call of the assistant
    message right before its run of results (or answers one twice), a call without an id, a call left unanswered."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        if message["role"] == "tool":
            raise MessageError(f"messages.{i}.tool_call_id", "messages with role 'tool' must be a response to a "
                                                               "preceding message with 'tool_calls'")
        out.append(message)
        end = i + 1
        if message["role"] == "assistant" and message.get("tool_calls"):
            while end < len(messages) and messages[end]["role"] == "tool":
                end += 1
            out.extend(_answers(message["tool_calls"], messages[i + 1:end], at=i))
        i = end
    return out


def _answers(calls: list[dict[str, Any]], results: list[dict[str, Any]], at: int) -> list[dict[str, Any]]:
    # `results` (messages at+1…) in the order of `calls` (message at's); each takes the first unanswered call with
    # its id, so calls that share an id are answered in turn.
    for k, call in enumerate(calls):
        if not call["id"]:
            raise MessageError(f"messages.{at}.tool_calls.{k}.id", "a tool call needs an id: its result names it")
    answered: dict[int, dict[str, Any]] = {}
    for n, result in enumerate(results, start=at + 1):
        wanted = result.get("tool_call_id")
        slot = next((k for k, call in enumerate(calls) if call["id"] == wanted and k not in answered), None)
        if slot is None:
            again = any(call["id"] == wanted for call in calls)
            raise MessageError(f"messages.{n}.tool_call_id",
                               f"'tool_call_id' of '{wanted}' answers a call an earlier tool message answered" if again
                               else f"Invalid parameter: 'tool_call_id' of '{wanted}' not found in 'tool_calls' of "
                                    "previous message.")
        answered[slot] = result
    if missing := [call["id"] for k, call in enumerate(calls) if k not in answered]:
        raise MessageError(f"messages.{at}.tool_calls",
                           "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                           "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                           f"{', '.join(missing)}")
    return [answered[k] for k in sorted(answered)]


class NotReasoning(ValueError):
    """A reasoning setting sent for a model that does not reason: OpenAI's unsupported_parameter, not a value's."""


def template_kwargs(body: ChatCompletionRequest, variables: frozenset[str] | None = None,
                    thinks: bool = False) -> dict[str, Any]:
    """Extra template variables of a request: `chat_template_kwargs`, and `reasoning_effort` where the template
    reads it (else "none" sets `enable_thinking` false, another effort sets it true); vLLM's switch
    (`enable_thinking`, `thinking`) asks as "none" or an effort the template picks. `variables`: what the
    template reads (None: unknown, nothing refused); `thinks`: the model writes thinking blocks.

    Raises ValueError naming the field when the template reads neither variable and the effort cannot be had:
    thinking that cannot be switched off, or an effort for a model that does not think."""
    kwargs = dict(body.chat_template_kwargs or {})
    asked = body.asked_thinking()
    if asked is None:
        return kwargs
    reads = (lambda name: True) if variables is None else variables.__contains__
    reads_effort = variables is not None and "reasoning_effort" in variables
    if reads_effort and asked.effort is not None:
        kwargs.setdefault("reasoning_effort", asked.effort)
    elif reads("enable_thinking"):
        kwargs.setdefault("enable_thinking", asked.on)
    elif reads_effort:
        pass  # thinking on, at the effort the template picks
    elif not asked.on and thinks:
        raise ValueError(f"{asked.field}: this model thinks and its chat template has no switch to turn that off")
    elif asked.on and not thinks:
        raise NotReasoning(f"{asked.field}: this model does not reason (its chat template has no reasoning setting)")
    return kwargs


def template_source(tokenizer: Any) -> list[str] | None:
    """The tokenizer's chat template text (every named template's, for several), or None when it has none or one
    is not text. Raises nothing."""
    source = getattr(tokenizer, "chat_template", None)
    if source is None:
        source = getattr(getattr(tokenizer, "_tokenizer", None), "chat_template", None)
    found = list(source.values()) if isinstance(source, dict) else [source]
    sources = [text for text in found if isinstance(text, str) and text]
    return sources if sources and len(sources) == len(found) else None


def reads_tool_calls(tokenizer: Any) -> bool:
    """Whether the chat template renders an assistant message's `tool_calls` (a template that does also renders
    tool results). Without a template, or one that never names them, calls and results must be written as text
    (`calls_as_text`); a template whose text cannot be read is trusted to. Raises nothing."""
    named = getattr(tokenizer, "chat_template", None)
    if isinstance(named, dict) and isinstance(named.get("tool_use"), str):
        # Named templates (Hermes 2 Pro / 3): transformers renders `tool_use` for a request with tools.
        return "tool_calls" in named["tool_use"]
    sources = template_source(tokenizer)
    if sources is None:
        return has_chat_template(tokenizer)
    return all("tool_calls" in text for text in sources)


def template_variables(tokenizer: Any) -> frozenset[str] | None:
    """The variables the tokenizer's chat template reads (every named template's, for several), or None when
    there is no template or it cannot be parsed. Raises nothing."""
    sources = template_source(tokenizer)
    if sources is None:
        return None
    try:
        from jinja2 import meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
        names: set[str] = set()
        for text in sources:
            names |= meta.find_undeclared_variables(env.parse(text))
        return frozenset(names)
    except Exception:  # noqa: BLE001 — an unparsable template: nothing can be refused by name
        return None


def takes_tools(tokenizer: Any, variables: frozenset[str] | None) -> bool:
    """Whether the chat template renders `tools` itself (`variables`: what it reads, None when unknown). Without a
    template (plain lines) or with one that never reads them, tools go in the prompt (`with_tool_prompt`); an
    unparsable template is trusted to take them. Raises nothing."""
    if not has_chat_template(tokenizer):
        return False
    return variables is None or "tools" in variables


# What opens the reply in a prompt rendered without a template ("role: content" lines, as mlx-lm writes them).
_PLAIN_OPENING = "assistant: "
# The conversations `generation_prompt` renders (a template that refuses the first may take the second).
PROBE_TEXT = "zq-probe"
_PROBES = ([{"role": "user", "content": PROBE_TEXT}],
           [{"role": "system", "content": PROBE_TEXT}, {"role": "user", "content": PROBE_TEXT}])


def render_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                kwargs: dict[str, Any] | None = None, *, continued: bool = False) -> tuple[str, bool]:
    """The conversation as the model's prompt text, with the generation prompt appended (`continued`: cut after the
    last message's text instead, a prefill the reply continues: service/chat/prefill.py), and whether its encoding
    adds the tokenizer's special tokens (only without a template; a template writes its own; without one, `tools`
    are described in the system line).
    Blocking, pure Python (jinja). Raises what the template raises (TemplateError, raise_exception, a bad
    kwarg; transformers' ValueError for a template that drops the message to continue)."""
    if not has_chat_template(tokenizer) and not (kwargs or {}).get("chat_template"):
        # No template: plain "role: content" lines, as mlx-lm does; tools go in a system line, never dropped.
        messages = with_tool_prompt(messages, tools) if tools else messages
        lines = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return (lines.removesuffix("\n") if continued else lines + _PLAIN_OPENING), True
    # continue_final_message is passed only when asked: a wrapper that does not know it renders every other prompt.
    prefill = {"continue_final_message": True} if continued else {}
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=not continued, tokenize=False,
                                         **prefill, **(kwargs or {}))
    return str(text), False


def generation_prompt(tokenizer: Any, kwargs: dict[str, Any] | None = None) -> str | None:
    """The text the template appends to open the reply (`add_generation_prompt`), found by rendering a short
    conversation with and without it; "assistant: " without a template; None when no probe renders or the two
    renderings do not share that prefix. Blocking (jinja). Raises nothing."""
    if not has_chat_template(tokenizer):
        return _PLAIN_OPENING
    for probe in _PROBES:
        try:
            opened = str(tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False,
                                                       **(kwargs or {})))
            closed = str(tokenizer.apply_chat_template(probe, add_generation_prompt=False, tokenize=False,
                                                       **(kwargs or {})))
        except Exception:  # noqa: BLE001 — a template that refuses this conversation: try the next
            continue
        return opened[len(closed):] if opened.startswith(closed) else None
    return None


def named_roles(tokenizer: Any) -> frozenset[str]:
    """The roles whose `name` the chat template writes into the prompt (Kimi's header does; most templates never read
    it, and Gemma 4's only for tool results), found by rendering short named conversations; none without a
    template. Blocking (jinja): once per tokenizer. Raises nothing."""
    if not has_chat_template(tokenizer):
        return frozenset()
    named: set[str] = set()
    # A template that refuses a system turn fails only the second conversation.
    for roles in (("user", "assistant", "user"), ("system", "user")):
        try:
            text, _ = render_text(tokenizer, [{"role": r, "content": "hi", "name": f"zq{r}probe"} for r in roles])
        except Exception:  # noqa: BLE001 — a conversation the template rejects shows no names
            continue
        named |= {r for r in roles if f"zq{r}probe" in text}
    return frozenset(named)


def encode_rendered(tokenizer: Any, text: str, special: bool) -> list[int]:
    """Token ids of rendered prompt text (as apply_chat_template(tokenize=True) would give). Blocking.
    Raises what the tokenizer raises."""
    tokens = tokenizer.encode(text) if special else tokenizer.encode(text, add_special_tokens=False)
    return [int(t) for t in tokens]


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                  kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the conversation with the generation prompt appended. Blocking: call it off the event
    loop. Raises what the template raises (jinja TemplateError, a template's raise_exception, a bad kwarg)."""
    return encode_rendered(tokenizer, *render_text(tokenizer, messages, tools, kwargs))


def system_prefix_end(tokenizer: Any, messages: list[dict[str, Any]], prompt: Sequence[int],
                      tools: list[dict[str, Any]] | None = None, kwargs: dict[str, Any] | None = None) -> tuple[int, ...]:
    """Token offset where the leading system messages (and tool definitions) end in `prompt`, as a
    one-element tuple; empty when there is none or the template cannot render the system block alone.
    Blocking. Raises nothing (a template that insists on a full conversation gives no boundary)."""
    probe_messages = system_probe(messages)
    if not probe_messages or not has_chat_template(tokenizer):
        return ()
    try:
        # The system block as the template renders it before any user turn: its common prefix with the
        # prompt is what every conversation with this system prompt (and tools) shares.
        probe = render_prompt(tokenizer, probe_messages, tools, kwargs)
    except Exception:  # noqa: BLE001 — no boundary, no harm
        return ()
    return common_prefix_boundary(probe, prompt)


def system_probe(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system messages and an empty user turn (what `system_prefix_end` renders), or [] when
    the conversation has no leading system block. Raises nothing."""
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    if n == 0 or n == len(messages):
        return []
    return messages[:n] + [{"role": "user", "content": ""}]


def common_prefix_boundary(probe: Sequence[int], prompt: Sequence[int]) -> tuple[int, ...]:
    """(length of the common prefix,) when it ends inside `prompt`, else (). Raises nothing."""
    end = 0
    for a, b in zip(probe, prompt):
        if a != b:
            break
        end += 1
    return (end,) if 0 < end < len(prompt) else ()
