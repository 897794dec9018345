"""transformers' chat-template render (``apply_chat_template(..., tokenize=False)``) in a faster sandbox.

Two costs dominate a chat template in Jinja's sandbox: ``message.content`` on a dict (the sandbox tries the
attribute first, and a failing ``getattr`` raises and catches an exception before the key is read) and the safety
decision taken again on every attribute read (``is_safe_attribute``: a chain of ``isinstance`` checks, some through
``abc``). ``FastSandbox`` keeps the policy of transformers' ``ImmutableSandboxedEnvironment`` and removes those
two costs only:

- on a plain ``dict``, a name that is no attribute of ``dict`` is read as a key directly: the stock sandbox's
  ``getattr`` fails there and then reads the key, so the outcome is the same (``message.items``, ``.get`` keep
  their meaning: those names go the stock way);
- the safety decision is cached per (type, name) for types whose decision reads nothing but the type and the name
  (the builtins and Jinja's loop and namespace objects, whose classes a template cannot change); the value read is
  still passed through the sandbox's ``str.format`` wrapper every time;
- a builtin method (a C type without attributes) is never marked unsafe, so ``is_safe_callable`` is not asked.

The environment is transformers' own (its filters, globals, extensions and options, through ``overlay``), so
``raise_exception``, ``tojson`` and ``strftime_now`` are transformers' functions. ``ChatTemplateRenderer`` renders
the first template of each renderer both ways and keeps the fast way only when the texts are equal.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

if TYPE_CHECKING:
    from jinja2 import Template
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# Names ``getattr`` finds on a plain dict (methods and dunders): everything else fails as an attribute.
_DICT_ATTRIBUTES = frozenset(dir(dict))
# Types whose sandbox decision depends on the type and the attribute name only (no instance state, no subclass).
_FIXED_TYPES = frozenset({str, dict, list, tuple, int, float, bool, type(None), LoopContext, Namespace})
_BUILTIN_METHOD = types.BuiltinMethodType
_CACHE_LIMIT = 4096  # names come from the template (and from format strings in content): keep the cache bounded


class FastSandbox(ImmutableSandboxedEnvironment):
    """transformers' immutable sandbox with the same refusals and cheaper allowed reads (see the module doc)."""

    _safe: dict[tuple[type, str], bool]

    def getattr(self, obj: Any, attribute: str) -> Any:
        """The stock sandbox's attribute lookup, with a dict's keys read directly (as the stock sandbox falls back
        to)."""
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:  # the stock sandbox's own fallback once getattr has failed
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        """The stock sandbox's answer, cached per (type, attribute) for the types whose answer cannot change."""
        kind = type(obj)
        if kind not in _FIXED_TYPES:
            return super().is_safe_attribute(obj, attr, value)
        key = (kind, attr)
        safe = self._safe.get(key)
        if safe is None:
            safe = super().is_safe_attribute(obj, attr, value)
            if len(self._safe) < _CACHE_LIMIT:
                self._safe[key] = safe
        return safe

    def is_safe_callable(self, obj: Any) -> bool:
        """The stock sandbox's answer; a builtin method is always safe there."""
        # A builtin method can carry no ``unsafe_callable``/``alters_data`` mark: the stock answer is always True.
        return type(obj) is _BUILTIN_METHOD or super().is_safe_callable(obj)


def stock_environment_template(chat_template: str) -> Template:
    """The template as transformers compiles it for ``apply_chat_template`` (its cache, its environment)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(chat_template)


@functools.lru_cache(maxsize=64)
def fast_template(chat_template: str) -> Template | None:
    """``chat_template`` compiled in a ``FastSandbox`` overlay of transformers' environment; None when that
    environment is not the immutable sandbox this module was written against."""
    stock = stock_environment_template(chat_template).environment
    if type(stock) is not ImmutableSandboxedEnvironment:
        return None
    env = stock.overlay()  # same options, filters, globals and (re-bound) extensions
    env.__class__ = FastSandbox
    env._safe = {}
    return env.from_string(chat_template)


# ``apply_chat_template``'s own parameters: a template kwarg with one of these names is bound to the parameter there.
_NAMED_PARAMETERS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


class ChatTemplateRenderer:
    """``tokenizer.apply_chat_template(messages, tools=..., chat_template=..., tokenize=False, **kwargs)`` for one
    tokenizer, template and kwargs, through ``FastSandbox`` once its first render equalled the stock one.

    Any difference, or a fast render that fails where the stock one did not, turns the fast way off for this
    renderer (logged once). Inputs the fast way does not model (an empty conversation, a tool given as a function, a
    kwarg named like one of ``apply_chat_template``'s parameters, a tokenizer overriding it) take the stock way.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: str, kwargs: Mapping[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.kwargs = dict(kwargs)
        self.verified = False
        self.enabled = self._supported()

    def _supported(self) -> bool:
        from transformers import PreTrainedTokenizerBase

        overridden = type(self.tokenizer).apply_chat_template is not PreTrainedTokenizerBase.apply_chat_template
        return not overridden and not _NAMED_PARAMETERS & self.kwargs.keys() and isinstance(self.chat_template, str)

    def render(self, messages: list[dict[str, Any]], tools: list[Any] | None, add_generation_prompt: bool) -> str:
        """The template's text for these messages: the fast render once verified against transformers', transformers'
        own otherwise."""
        fits = self.enabled and messages and all(type(t) is dict for t in tools or ())
        if fits and self.verified:
            return self.render_fast(messages, tools, add_generation_prompt)
        text = self.render_stock(messages, tools, add_generation_prompt)
        if fits:
            self._verify(text, messages, tools, add_generation_prompt)
        return text

    def render_stock(
        self, messages: list[dict[str, Any]], tools: Sequence[Any] | None, add_generation_prompt: bool
    ) -> str:
        """transformers' ``apply_chat_template(..., tokenize=False)`` with this renderer's kwargs."""
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.kwargs,
        )

    def render_fast(self, messages: list[dict[str, Any]], tools: list[Any] | None, add_generation_prompt: bool) -> str:
        """The same render through the faster sandbox overlay (raises ``LookupError`` where it cannot apply)."""
        template = fast_template(self.tokenizer.get_chat_template(self.chat_template, tools))
        if template is None:
            raise LookupError("transformers' template environment is not ImmutableSandboxedEnvironment")
        # As transformers' render_jinja_template: special tokens first, the caller's kwargs over them.
        variables = {**self.tokenizer.special_tokens_map, **self.kwargs}
        return template.render(
            messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **variables
        )

    def _verify(self, stock: str, messages: list[dict[str, Any]], tools: list[Any] | None, generation: bool) -> None:
        try:
            fast = self.render_fast(messages, tools, generation)
        except Exception as exc:  # noqa: BLE001 - the stock render succeeded: any failure here is the fast way's
            why = f"it failed where transformers' render did not ({type(exc).__name__}: {exc})"
        else:
            if fast == stock:
                self.verified = True
                return
            why = "its text differs from transformers' render"
        self.enabled = False
        log.warning("chat template: the fast Jinja sandbox is off for this renderer: %s", why)
