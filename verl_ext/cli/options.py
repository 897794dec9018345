"""Options shared by the subcommands: loading the renderer and resolving ``--stop`` tokens."""

from __future__ import annotations

import argparse
import json
from typing import Any

from verl_ext.core.errors import OptionsError
from verl_ext.core.rendering import ChatRenderer, load_renderer


def renderer_from_args(tokenizer_dir: str, args: argparse.Namespace) -> ChatRenderer:
    kwargs = template_kwargs_from_args(getattr(args, "template_kwargs", None))
    return load_renderer(tokenizer_dir, chat_template_file=args.chat_template, template_kwargs=kwargs)


def template_kwargs_from_args(text: str | None) -> dict[str, Any]:
    """``--template-kwargs JSON``: a JSON object of keyword arguments for the chat template."""
    if text is None:
        return {}
    example = "'{\"enable_thinking\": false}'"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionsError(
            f"--template-kwargs {text!r} is not valid JSON ({exc.msg} at column {exc.colno}); pass a JSON object, "
            f"e.g. --template-kwargs {example}"
        ) from None
    if not isinstance(value, dict):
        raise OptionsError(
            f"--template-kwargs must be a JSON object of template keyword arguments, got a JSON "
            f"{type(value).__name__} ({text!r}); e.g. --template-kwargs {example}"
        )
    return value


def stop_ids_from_args(renderer: ChatRenderer, stops: list[str]) -> list[int]:
    """Each ``--stop`` is a token id or a string that must encode to exactly one token."""
    ids: list[int] = []
    for stop in stops:
        if stop.isdigit():
            ids.append(int(stop))
            continue
        encoded = renderer.encode(stop)
        if len(encoded) != 1:
            raise OptionsError(
                f"--stop {stop!r} encodes to {len(encoded)} tokens {encoded}; an engine stop id is one token. "
                "Pass a single token (string or id)"
            )
        ids.append(encoded[0])
    return ids
