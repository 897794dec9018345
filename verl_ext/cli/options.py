"""Options shared by the subcommands: loading the renderer and resolving ``--stop`` tokens."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_ext.core.errors import IsAFolderError, MissingFileError, NotAFolderError, OptionsError
from verl_ext.core.rendering import ChatRenderer, load_renderer
from verl_ext.core.tokenizer_files import template_variables
from verl_ext.core.turn_end import stop_text_id

# Variables transformers itself passes to every chat template: never a template kwarg of the user's.
_CALLER_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def renderer_from_args(tokenizer_dir: str, args: argparse.Namespace) -> ChatRenderer:
    """The renderer the subcommand works with: the tokenizer folder, ``--chat-template`` and ``--template-kwargs``,
    each refused with the reason when it cannot be what the user meant (see ``check_template_kwargs``)."""
    kwargs = template_kwargs_from_args(getattr(args, "template_kwargs", None))
    renderer = load_renderer(tokenizer_dir, chat_template_file=args.chat_template, template_kwargs=kwargs)
    check_template_kwargs(renderer, kwargs)
    return renderer


def check_template_kwargs(renderer: ChatRenderer, kwargs: dict[str, Any]) -> None:
    """Refuse a template kwarg the chat template never reads (a typo such as ``enable_thinkin``, or a kwarg meant
    for another model's template): it would change nothing, and the audit would describe another setting than
    the one the user asked about."""
    template = renderer.chat_template or ""
    readable = template_variables(template) - _CALLER_VARIABLES if template else frozenset()
    unread = [key for key in kwargs if key not in readable]
    if not unread:
        return
    key = unread[0]
    close = difflib.get_close_matches(key, sorted(readable), n=1)
    hint = f"did you mean {close[0]!r}? " if close else "leave it out; "
    known = ", ".join(repr(v) for v in sorted(readable)) or "none"
    raise OptionsError(
        f"--template-kwargs: the chat template never reads {key!r}, so it would change nothing; {hint}the variables "
        f"it reads: {known} (template from {renderer.template_source})"
    )


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
    """Each ``--stop`` is a token id of the vocabulary (0 to its size - 1) or a string that must encode to exactly
    one token; a negative number or an id past the vocabulary is refused (no engine output can hold it)."""
    ids: list[int] = []
    for stop in stops:
        if re.fullmatch(r"\s*[-+]?\d+\s*", stop):
            token_id = int(stop)
            if not 0 <= token_id < renderer.vocab_size:
                raise OptionsError(
                    f"--stop {stop!r}: a stop id must be a token id of this tokenizer, 0 to {renderer.vocab_size - 1} "
                    f"({renderer.vocab_size:,} ids); pass an id in that range or the token's text "
                    "(e.g. --stop '</tool_call>')"
                )
            ids.append(token_id)
            continue
        ids.append(stop_text_id(renderer.encode, stop, "--stop"))
    return ids


def check_output_file(path: str, option: str, example: str = "report.html") -> Path:
    """``path`` as a file the command can write, checked before any slow work: not a folder, in a folder that
    exists and can be written. Raises an error naming ``option``, the path and the fix."""
    out = Path(path)
    if out.is_dir():
        raise IsAFolderError(f"{option} {path!r} is a folder; pass a file name, e.g. {str(out / example)!r}")
    folder = out.parent
    if folder.exists() and not folder.is_dir():
        raise NotAFolderError(f"{option} {path!r}: {str(folder)!r} is a file, not a folder; pass a path in a folder")
    if not folder.is_dir():
        raise MissingFileError(f"{option} {path!r}: folder {str(folder)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise OptionsError(f"{option} {path!r} cannot be written (permissions); pass a path this user can write")
    # Permissions do not tell everything (root may "write" anywhere, yet /proc takes no new file): open it for
    # writing, as the command will, without changing what is there.
    try:
        if out.exists():
            os.close(os.open(out, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        else:
            _create_and_remove(out)
    except OSError as exc:
        raise OptionsError(
            f"{option} {path!r} cannot be written ({exc.strerror or exc}); pass a path in a folder this user can write"
        ) from None
    return out


def check_output_folder(path: str, option: str) -> Path:
    """``path`` as a folder the command can write into (created when missing), checked before any slow work. Raises
    an error naming ``option``, the path and the fix."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise NotAFolderError(f"{option} {path!r} is a file, not a folder; pass a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        _create_and_remove(out / f".verl-ext-write-check-{os.getpid()}")
    except OSError as exc:
        raise OptionsError(
            f"{option} {path!r} cannot be written ({exc.strerror or exc}); pass a folder this user can write"
        ) from None
    return out


def _create_and_remove(path: Path) -> None:
    """Create ``path`` as a new empty file and remove it: whether this user can write a file there (OSError if not)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    path.unlink()


def distinct_files(paths: Sequence[str], command: str) -> list[str]:
    """``paths`` with a file given twice (by the same or another name) kept once, saying so on stderr: counted
    twice, its rollouts would weigh double in every figure."""
    seen: dict[str, str] = {}
    out: list[str] = []
    for path in paths:
        key = os.path.realpath(path)
        if key in seen:
            again = "" if seen[key] == path else f" (as {seen[key]!r})"
            print(f"verl-ext {command}: warning: {path!r} was given before{again}; it is read once", file=sys.stderr)
            continue
        seen[key] = path
        out.append(path)
    return out
