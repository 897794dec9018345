"""A request's reasoning effort (chat completions' ``reasoning_effort``, Responses' ``reasoning.effort``, Anthropic's
``thinking`` type) read as the chat template's thinking switch.

A template that lets the caller choose whether the policy reasons reads a variable for it: Qwen3's and GLM's
``enable_thinking``, DeepSeek V3.1's and Granite's ``thinking`` (booleans), gpt-oss's ``reasoning_effort`` (a level).
The gateway renders every session with one setting of it (``--template-kwargs``, or verl's
``apply_chat_template_kwargs`` in training): the prompts of a session, its check and its record are rendered with
it, and so is what the trainer trains on. So an effort is served where it asks for what the gateway renders ("none"
for thinking off, any level for thinking on; for a level-reading template, that level), and refused otherwise with
the setting the gateway renders and how to start it with the other; a template without a switch refuses any effort
(the policy reasons as its template renders). Never ignored.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass

from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.tokenizer_files import template_variables
from verl_ext.gateway.errors import GatewayError, bad_request

EFFORTS = ("none", "minimal", "low", "medium", "high")  # the API's values; "none": no reasoning
# Reasoning at whatever level the template renders: Anthropic's ``thinking`` ``enabled`` / ``adaptive`` (no level)
REASONING_ON = "on"
BOOLEAN_SWITCHES = ("enable_thinking", "thinking")
LEVEL_SWITCH = "reasoning_effort"
_PROBE = [{"role": "user", "content": "Hi"}]


@dataclass(frozen=True)
class ThinkingSwitch:
    """The template variable that switches reasoning and how the gateway renders it: ``thinks`` for a boolean
    switch, ``level`` (the level rendered) for a level switch."""

    variable: str
    thinks: bool
    level: str | None = None

    def serves(self, effort: str) -> bool:
        """Whether a request's ``effort`` asks for what the gateway renders."""
        if self.level is not None:
            return effort in (self.level, REASONING_ON)  # a level template always reasons, at its level
        return (effort != "none") == self.thinks

    def setting(self) -> str:
        """What the gateway renders, as its template kwarg: ``enable_thinking=true``, ``reasoning_effort='high'``."""
        if self.level is not None:
            return f"{self.variable}={self.level!r}"
        return f"{self.variable}={'true' if self.thinks else 'false'}"


def _text(renderer: ChatRenderer, **kwargs: object) -> str:
    kwargs = {**renderer.template_kwargs, **kwargs}
    return renderer.with_template_kwargs(kwargs).render_text(_PROBE, None, True)


# each renderer's switch, probed once: the probe renders the template 2-7 times, on the request path
_SWITCHES: weakref.WeakKeyDictionary[ChatRenderer, tuple[ThinkingSwitch | None]] = weakref.WeakKeyDictionary()


def thinking_switch(renderer: ChatRenderer) -> ThinkingSwitch | None:
    """The renderer's thinking switch (the module docstring), or None where its template reads none, or reads one
    that changes nothing it renders; probed once per renderer."""
    if renderer not in _SWITCHES:
        _SWITCHES[renderer] = (_probed_switch(renderer),)
    return _SWITCHES[renderer][0]


def _probed_switch(renderer: ChatRenderer) -> ThinkingSwitch | None:
    variables = template_variables(renderer.chat_template or "") if renderer.chat_template else frozenset()
    rendered = _text(renderer)
    if LEVEL_SWITCH in variables:
        levels = [lv for lv in ("low", "medium", "high") if _text(renderer, **{LEVEL_SWITCH: lv}) == rendered]
        if len(levels) == 1:
            return ThinkingSwitch(LEVEL_SWITCH, True, levels[0])
    for variable in BOOLEAN_SWITCHES:
        if variable not in variables:
            continue
        on, off = _text(renderer, **{variable: True}), _text(renderer, **{variable: False})
        if on != off and rendered in (on, off):
            return ThinkingSwitch(variable, rendered == on)
    return None


def check_effort(renderer: ChatRenderer, effort: object, param: str, sent: object = None) -> None:
    """Raises a 400 naming ``param`` for an effort the gateway does not render (the module docstring); None (not
    given) passes. ``sent``: what ``param`` said, named in a refusal, where it is not the effort itself (Anthropic's
    ``thinking: {"type": "disabled"}`` is the effort "none", ``enabled`` and ``adaptive`` are ``REASONING_ON``:
    reasoning at the level the template renders)."""
    if effort is None:
        return
    if effort not in EFFORTS and not (effort == REASONING_ON and sent is not None):
        raise bad_request(param, f"'{param}' must be one of {', '.join(map(repr, EFFORTS))}, got {effort!r}")
    switch = thinking_switch(renderer)
    if switch is None:
        raise _refused(
            param,
            f"'{param}' is not served: the chat template has no thinking switch (it reads none of "
            f"{', '.join((*BOOLEAN_SWITCHES, LEVEL_SWITCH))}), so the policy reasons as its template renders; "
            "leave it out",
        )
    if switch.serves(str(effort)):
        return
    if switch.level is not None:
        wanted = f'{{"{switch.variable}": "{effort}"}}' if effort in ("low", "medium", "high") else None
    else:
        wanted = f'{{"{switch.variable}": {"false" if effort == "none" else "true"}}}'
    asked = {"none": "no reasoning", REASONING_ON: "reasoning"}.get(str(effort), f"reasoning effort {effort!r}")
    shown = repr(effort) if sent is None else json.dumps(sent)
    fix = (
        f"start the gateway with --template-kwargs '{wanted}' (in training: data.apply_chat_template_kwargs), or "
        if wanted
        else ""
    )
    raise _refused(
        param,
        f"'{param}' {shown} asks for {asked}, but this gateway renders every session with the chat template's "
        f"{switch.setting()} (its prompts, check and records use one setting): {fix}leave '{param}' out",
    )


def _refused(param: str, message: str) -> GatewayError:
    return bad_request(param, message, "unsupported")
