"""Options shared by the subcommands: loading the renderer and resolving ``--stop`` tokens."""

from __future__ import annotations

import argparse

from verl_ext.core.rendering import ChatRenderer, load_renderer


def renderer_from_args(tokenizer_dir: str, args: argparse.Namespace) -> ChatRenderer:
    return load_renderer(tokenizer_dir, chat_template_file=args.chat_template)


def stop_ids_from_args(renderer: ChatRenderer, stops: list[str]) -> list[int]:
    """Each ``--stop`` is a token id or a string that must encode to exactly one token."""
    ids: list[int] = []
    for stop in stops:
        if stop.isdigit():
            ids.append(int(stop))
            continue
        encoded = renderer.encode(stop)
        if len(encoded) != 1:
            raise ValueError(
                f"--stop {stop!r} encodes to {len(encoded)} tokens {encoded}; an engine stop id is one token. "
                "Pass a single token (string or id)"
            )
        ids.append(encoded[0])
    return ids
