"""What a chat template writes for one assistant message, with the message's own data left as slots.

The per-turn verdict (``sampled_text``) asks whether the text a template renders for a turn is the template's own
text or data the engine sampled. A template writes a tool call in its own format (Kimi's
``functions.NAME:0``, Seed-OSS's ``<function=NAME><parameter=KEY>VALUE</parameter>``, DeepSeek's
``function<sep>NAME`` and code fence), whatever format the model sampled it in. Rendering the message once more with
every data string (content, reasoning, each call's name, argument keys and values) replaced by a slot marker shows
which text is the template's: the verdict then matches a rendered run against that shape, and only what fills a
slot must be sampled text. Call ids are the loop's metadata, never sampled: they stay as they are (template text).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from verl_ext.check.fact_renders import with_tools_if_needed
from verl_ext.check.sampled_text import text_runs
from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import TemplateProfile

SLOT = re.compile(r"QXSLOT\d+QX")
_USER = {"role": "user", "content": "QXUSER"}
# per template and message shape (its keys and value types, data masked): a few dozen per template in practice, but
# a model's tool-call arguments can take new shapes all run long, so the least recently used go past 1,024
_SHAPES: LruCache[tuple[str, str], tuple[str, ...]] = LruCache("message shapes", 1024)
_GENERIC: LruCache[tuple[str, str], tuple[str, ...] | None] = LruCache("message shapes with stand-in ids", 1024)


def message_shape(renderer: ChatRenderer, profile: TemplateProfile, message: Mapping[str, Any]) -> tuple[str, ...]:
    """The squashed text runs the template writes for ``message`` after a user turn, each data string a slot
    (``SLOT``); empty when the template cannot render the masked message alone. Cached per template and shape.

    Call ids differ in every turn, so the shape is rendered with stand-ins for them, twice (``_stand_in``: each
    id's letters, digits and other characters kept as such, so a template that checks an id's length or characters
    accepts a stand-in as it accepts the id): where the two renders' runs are the same, no part of an id shows in
    the runs (an id inside JSON, which the runs leave out, or one not rendered), and the runs are shared by every
    turn of that shape; else the message is rendered with its own ids."""
    masked = _masked(message)
    first = _with_stand_ins(masked, _STAND_IN_FORMS[0]) if _STAND_IN_FORMS else None
    if first is not None:
        # the answer for this shape, once per template and shape: its runs, or None where an id shows in them
        key = (renderer.fingerprint, "stand-ins " + json.dumps(first, sort_keys=True, default=str))
        if key not in _GENERIC:
            runs = [_shape(renderer, profile, first)]
            runs += [_shape(renderer, profile, _with_stand_ins(masked, form) or {}) for form in _STAND_IN_FORMS[1:]]
            _GENERIC[key] = runs[0] if all(r == runs[0] for r in runs) else None
        generic = _GENERIC[key]
        if generic is not None:
            return generic
    return _shape(renderer, profile, masked)


def _shape(renderer: ChatRenderer, profile: TemplateProfile, masked: Mapping[str, Any]) -> tuple[str, ...]:
    key = (renderer.fingerprint, json.dumps(masked, sort_keys=True, default=str))
    if key not in _SHAPES:
        runs: tuple[str, ...] = ()
        chat = profile.tool_call_shape.conform([_USER, masked])
        try:
            head, full = with_tools_if_needed(
                lambda tools: (
                    renderer.render_text([_USER], tools, add_generation_prompt=True),
                    renderer.render_text(chat, tools),
                )
            )
        except Exception:  # noqa: BLE001 - a template that needs more to render: no shape (a stricter verdict)
            full = head = ""
        if full:
            # After the generation prompt where the message continues it; else after what the two share (a template
            # that writes an empty message without the prompt's trailing newline).
            body = full[len(os.path.commonprefix([head, full])) :]
            runs = tuple(dict.fromkeys(text_runs(body, renderer.control_pattern)))
        _SHAPES[key] = runs
        return runs
    return _SHAPES[key]


# Two forms of stand-in ids (``_stand_in``): the letters, upper and lower case, and the digit each writes.
_STAND_IN_FORMS = (("jz", "0"), ("vk", "7"))


def _stand_in(call_id: str, letters: str, digit: str) -> str:
    """An id of ``call_id``'s form: its ASCII letters ``letters`` alternately (upper case where upper), its digits
    ``digit``, anything else as it is: the same length and the same kinds of characters."""
    out = []
    for k, ch in enumerate(call_id):
        if ch.isascii() and ch.isalpha():
            letter = letters[k % len(letters)]
            out.append(letter.upper() if ch.isupper() else letter)
        elif ch.isascii() and ch.isdigit():
            out.append(digit)
        else:
            out.append(ch)
    return "".join(out)


def _with_stand_ins(masked: Mapping[str, Any], form: tuple[str, str]) -> dict[str, Any] | None:
    """``masked`` with every call's string id a stand-in of ``form``; None where no call has a string id."""
    calls = masked.get("tool_calls") or ()
    if not any(isinstance(c, Mapping) and isinstance(c.get("id"), str) for c in calls):
        return None
    swapped = [
        {**c, "id": _stand_in(c["id"], *form)} if isinstance(c, Mapping) and isinstance(c.get("id"), str) else c
        for c in calls
    ]
    return {**masked, "tool_calls": swapped}


def _masked(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` with every data string a numbered slot (empty strings and call ids kept as they are)."""
    count = iter(range(1_000_000))

    def slot(value: Any) -> Any:
        return f"QXSLOT{next(count)}QX" if value not in ("", None) else value

    out: dict[str, Any] = {"role": "assistant"}
    for key in ("content", "reasoning_content", "thinking"):
        if key in message:
            value = message[key]
            out[key] = slot(value) if isinstance(value, str) else value
    calls = []
    for call in message.get("tool_calls") or ():
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
            calls.append(call)
            continue
        function = dict(call["function"])
        function["name"] = slot(function.get("name"))
        args = function.get("arguments")
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except json.JSONDecodeError:
                parsed = None
            args = parsed if isinstance(parsed, dict) else args
        function["arguments"] = {slot(k): slot(v) for k, v in args.items()} if isinstance(args, dict) else slot(args)
        calls.append({**call, "function": function})
    if "tool_calls" in message:
        out["tool_calls"] = calls
    return out
