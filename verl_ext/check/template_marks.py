"""Template marks: what a template writes around an assistant message, its reasoning and its calls, and at the end
of a prompt, learned once per template from renders of marker conversations."""

from __future__ import annotations

import os
from typing import Any

from verl_ext.check.fact_renders import with_tools_if_needed
from verl_ext.check.sampled_text import frame_runs
from verl_ext.check.tool_call_compare import call_markers
from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.call_reader.literals import MARKER
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import TemplateProfile

# per template (fingerprint): a process checks one template, or a few
_FRAMES: LruCache[str, tuple[frozenset[str], tuple[str, ...], tuple[str, ...]]] = LruCache("message frames", 64)


def assistant_frame(r: ChatRenderer) -> tuple[frozenset[str], tuple[str, ...], tuple[str, ...]]:
    """What the template writes around any assistant message's content (squashed text runs, structure aside), the
    non-whitespace text it writes around reasoning (its tags), and of those the ones after the reasoning (its
    closes): rendered once per template with marker texts."""
    key = r.fingerprint
    if key not in _FRAMES:
        user = {"role": "user", "content": "QXUSER"}
        frame: frozenset[str] = frozenset()
        tags: tuple[str, ...] = ()
        closes: tuple[str, ...] = ()
        answer = {"role": "assistant", "content": "QXANSWER"}
        try:
            head, plain, thought = with_tools_if_needed(
                lambda tools: (
                    r.render_text([user], tools, add_generation_prompt=True),
                    r.render_text([user, answer], tools),
                    r.render_text([user, {**answer, "reasoning_content": "QXTHOUGHT"}], tools),
                )
            )
        except Exception:  # a template that needs more than this to render: no frame, no tags (stricter verdicts)
            head = plain = thought = ""
        if plain.startswith(head) and "QXANSWER" in plain:
            before, _, after = plain[len(head) :].partition("QXANSWER")
            frame = frame_runs(before, after, r.control_pattern)
        if thought.startswith(head) and "QXTHOUGHT" in thought:
            around = thought[len(head) :].replace("QXANSWER", " ").split("QXTHOUGHT")
            tags = tuple(t for t in dict.fromkeys(w for part in around for w in part.split()) if t not in head)
            between = thought[len(head) :].split("QXTHOUGHT", 1)[1].partition("QXANSWER")[0]
            closes = tuple(t for t in dict.fromkeys(between.split()) if t not in head)
        _FRAMES[key] = (frame, tags, closes)
        return frame, tags, closes
    return _FRAMES[key]


# A conversation ending in a message of each role after an assistant turn (marker texts), and the assistant messages
# that may follow it: with text, or with a tool call.
_PROBE_CALL = {"id": "call00001", "type": "function", "function": {"name": "calculator", "arguments": {"x": "1"}}}
PROMPT_CONTEXTS: dict[str, list[dict[str, Any]]] = {
    "tool": [
        {"role": "user", "content": "QXUSER"},
        {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]},
        {"role": "tool", "content": "QXTOOL", "tool_call_id": "call00001", "name": "calculator"},
    ],
    "user": [
        {"role": "user", "content": "QXUSER"},
        {"role": "assistant", "content": "QXANSWER"},
        {"role": "user", "content": "QXUSERB"},
    ],
}
_FOLLOWERS = {
    False: {"role": "assistant", "content": "QXNEXT"},
    True: {"role": "assistant", "content": "", "tool_calls": [{**_PROBE_CALL, "id": "call00002"}]},
}
# per template, role and whether a call follows: 6 per template
_PROMPT_TAILS: LruCache[tuple[str, str, bool], tuple[int, ...]] = LruCache("prompt tails", 256)


def prompt_tail(r: ChatRenderer, profile: TemplateProfile, role: str, calls: bool) -> tuple[int, ...]:
    """What the template writes at the end of a prompt ending in a ``role`` message (generation prompt included)
    that it does not write there once an assistant message (with a tool call: ``calls``) follows; rendered once per
    template (empty where it cannot render the marker conversation)."""
    key = (r.fingerprint, role, calls)
    if key not in _PROMPT_TAILS:
        chat = profile.tool_call_shape.conform(PROMPT_CONTEXTS[role])
        follows = profile.tool_call_shape.conform([*chat, _FOLLOWERS[calls]])
        try:
            prompt, history = with_tools_if_needed(
                lambda tools: (
                    r.render(chat, tools, add_generation_prompt=True, escape=False).ids,
                    r.render(follows, tools, add_generation_prompt=False).ids,
                )
            )
            tail = tuple(prompt[len(os.path.commonprefix([prompt, history])) :])
        except Exception:  # noqa: BLE001 - a template that needs more to render: no tail known (a stricter check)
            tail = ()
        _PROMPT_TAILS[key] = tail
        return tail
    return _PROMPT_TAILS[key]


# Per template fingerprint; a worker checks one template in practice.
_CALL_MARKERS: LruCache[str, tuple[str, str] | None] = LruCache("tool-call markers", 64)


def template_call_markers(r: ChatRenderer, profile: TemplateProfile) -> tuple[str, str] | None:
    """The control texts (or, where it has none, the tag-shaped plain texts) the template writes once per tool call,
    around its name and arguments (``tool_call_compare``), read from its rendering of an assistant message with two
    calls; rendered once per template (None where it cannot render two calls in a message or writes no such texts)."""
    if r.fingerprint not in _CALL_MARKERS:
        second = {**_PROBE_CALL, "id": "call00002", "function": {**_PROBE_CALL["function"], "name": "search"}}
        message = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL, second]}
        user = {"role": "user", "content": "QXUSER"}
        try:
            head, full = with_tools_if_needed(
                lambda tools: (
                    r.render_text([user], tools, add_generation_prompt=True),
                    r.render_text(profile.tool_call_shape.conform([user, message]), tools),
                )
            )
        except Exception:  # noqa: BLE001 - a template that refuses two calls in a message
            full = head = ""
        cut = len(os.path.commonprefix([head, full]))
        # The shared prefix may end inside a marker (a generation prompt's "<think>" against the history's
        # "<tool_call>" share "<t"): the body starts at that marker, else its first call's opener is cut.
        for pattern in (r.control_pattern, MARKER):
            for m in pattern.finditer(full, max(cut - 64, 0)) if pattern is not None else ():
                if m.start() < cut < m.end():
                    cut = m.start()
        body = full[cut:]
        keys = list(_PROBE_CALL["function"]["arguments"])
        names = ["calculator", "search"]
        # Where the tokenizer holds them as plain text (Hermes' <tool_call> on a Llama 3 tokenizer), the markers are the
        # tag-shaped texts the template writes once per call: whitespace next to them merges into their last
        # characters' tokens (">" against ">\n"), and the text verdict alone would read a newline the template puts
        # between two calls as a space inside the content.
        markers = None
        if body:
            markers = call_markers(body, names, r.control_pattern, keys) or call_markers(body, names, MARKER, keys)
        _CALL_MARKERS[r.fingerprint] = markers
    return _CALL_MARKERS[r.fingerprint]
