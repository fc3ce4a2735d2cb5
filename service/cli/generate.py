"""`tandem generate PROMPT`: stream one chat reply to the terminal, no server (same prompt rendering
as the server: service/chat/prompt.py)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from service.cli.errors import CLIError
from service.cli.parsers import add_command, checked, positive_int
from service.cli.resolve import resolve_adapter, resolve_chat_model

__all__ = ["add_generate"]


def add_generate(sub: Any) -> None:
    """Register `tandem generate`. Raises nothing."""
    p = add_command(sub, "generate", "stream one chat reply to the terminal (no server)")
    p.add_argument("prompt", help="the user message; - reads it from stdin")
    p.add_argument("--model", default=None,
                   help="chat model: dir, .gguf or cached repo id, as `serve` takes it (the id /v1/models shows for a "
                        "local dir or file is only its name: give the path) (default: the demo)")
    p.add_argument("--adapter-path", default=None, metavar="DIR",
                   help="a fine-tune's adapter folder as mlx_lm.lora writes it, applied to the model (as `serve`) "
                        "(default: none)")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="most tokens to generate")
    p.add_argument("--temperature", type=_temperature, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=_top_p, default=1.0,
                   help="nucleus sampling: draw among the likeliest tokens whose probabilities add up to this (0: "
                        "only the likeliest, greedy, as the API's top_p 0)")
    p.add_argument("--stop", action="append", type=_stop, default=[], metavar="TEXT",
                   help="end the reply where this text first appears (it is not printed); repeat for several, as the "
                        "API's stop list (default: none)")
    p.add_argument("--seed", type=_seed, default=None, help="sampling seed, 0..2^64-1 (default: random)")
    p.add_argument("--system", default=None, help="system prompt (default: none)")
    p.set_defaults(func=_generate)


# nan and inf sample garbage
_temperature = checked(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
_seed = checked(int, lambda v: 0 <= v < 2**64, "in 0..2^64-1 (the sampler's PRNG key)")
_top_p = checked(float, lambda v: 0 <= v <= 1, "in [0, 1]")  # nan fails both comparisons


def _stop(text: str) -> str:
    """A --stop text; an empty one would end every reply before it began. Raises argparse.ArgumentTypeError."""
    if not text:
        raise argparse.ArgumentTypeError("empty: give the text that ends the reply")
    return text


def _generate(args: argparse.Namespace) -> int:
    if args.prompt == "-":
        if sys.stdin is None:  # started with stdin closed (`<&-`): Python leaves sys.stdin None
            raise CLIError("- reads the prompt from stdin, which is closed: pipe the prompt in (echo hi | tandem "
                           "generate -)")
        try:
            args.prompt = sys.stdin.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"cannot read the prompt from stdin: {exc}") from None
        if not args.prompt:
            raise CLIError("the prompt read from stdin is empty")
    try:  # bytes that are not UTF-8 arrive as lone surrogates (argv, a C locale's stdin): the tokenizer's error misled
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise CLIError("the prompt is not UTF-8 text") from None
    resolve_chat_model(args.model)  # a bad name fails here, before MLX loads anything
    adapter_path = resolve_adapter(args.adapter_path)
    import anyio

    from engine.contracts import GenerationRequest, SamplingParams
    from engine.errors import EngineClosed, EngineError
    from engine.models import load_model
    from engine.runtime import Engine, generate_stream
    from service.chat.output import ChatTranslator
    from service.chat.prompt import generation_prompt, render_prompt

    # One line for what the model or its template refuses, as `serve` gives it (these were tracebacks).
    from service.process.cleanup import loading_models

    try:
        with loading_models():  # a GGUF conversion under way is not a server's to remove as interrupted
            loaded = load_model(args.model, adapter_path=adapter_path)
    except Exception as exc:  # noqa: BLE001 — any loader failure is the user's model, not a crash
        raise CLIError(f"could not load model {args.model}: {type(exc).__name__}: {exc}") from None
    engine = Engine(loaded, max_active=1)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    try:
        prompt = render_prompt(engine.tokenizer, messages)
    except Exception as exc:  # noqa: BLE001 — e.g. a template that raises on a system message
        raise CLIError(f"the model's chat template refused the messages: {exc}") from None
    context = engine.context_length or 0
    if context and len(prompt) >= context:
        raise CLIError(f"the prompt ({len(prompt)} tokens) leaves no room in the model's context of {context} tokens")
    room = min(args.max_tokens, context - len(prompt)) if context else args.max_tokens
    request = GenerationRequest(
        prompt_tokens=prompt,
        # --top-p 0 is greedy, as the server maps top_p 0 (a nucleus of nothing but the likeliest token).
        sampling=SamplingParams(temperature=0.0 if args.top_p == 0 else args.temperature,
                                top_p=1.0 if args.top_p == 0 else args.top_p, seed=args.seed),
        max_tokens=room,
        stop=tuple(args.stop),
    )

    # The reply as a client reads it: thinking (a think block, gpt-oss's analysis channel) to stderr, dimmed on a
    # terminal, the answer to stdout, without the family's markup.
    translator = ChatTranslator.for_request(engine.tokenizer, prompt, calls=False,  # no tools declared here
                                            opening=generation_prompt(engine.tokenizer))
    dim = ("\x1b[2m", "\x1b[0m") if sys.stderr.isatty() else ("", "")

    def write(deltas: list[Any]) -> None:
        for d in deltas:
            if d.reasoning_content:
                sys.stderr.write(f"{dim[0]}{d.reasoning_content}{dim[1]}")
                sys.stderr.flush()
            if d.content:
                sys.stdout.write(d.content)
                sys.stdout.flush()

    def show(delta: Any) -> None:
        write(translator.feed(delta.text))

    start = time.perf_counter()
    try:
        result = anyio.run(generate_stream, engine, request, show)
    except EngineError as exc:
        raise CLIError(str(exc)) from None
    except BaseExceptionGroup as group:  # the engine's task group wraps what the request raised
        matched, _ = group.split(EngineError)
        if matched is None:
            raise
        causes = _leaves(matched)  # the request's own error first, the engine closing after it last
        causes.sort(key=lambda exc: isinstance(exc, EngineClosed))
        raise CLIError(str(causes[0])) from None
    write(translator.finish())
    seconds = time.perf_counter() - start
    sys.stdout.write("\n")
    rate = result.completion_tokens / seconds if seconds > 0 else 0.0
    print(
        f"[{result.prompt_tokens} prompt + {result.completion_tokens} generated tokens in {seconds:.2f} s, "
        f"{rate:.1f} tok/s, finish: {result.finish_reason}]",
        file=sys.stderr,
    )
    return 0


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for inner in group.exceptions for leaf in _leaves(inner)]
    return [group]
