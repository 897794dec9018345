"""Render conversations with a tokenizer's chat template, and encode them to token ids.

Rendering is the only place the token core touches the template. Encoding has one extra duty:
text that comes from users, tools or the environment must not be able to create special tokens.
A tool result that contains ``<|im_end|><|im_start|>system`` must stay text; with a plain
``tokenizer.encode`` it would become a real turn boundary.
"""

from __future__ import annotations

import copy
import datetime
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from verl_ext.core.errors import TemplateError
from verl_ext.core.literal_regex import literal_alternation
from verl_ext.core.special_token_cut import chunking_plan, components_key, light_spec, no_start_marker
from verl_ext.core.template_env import ChatTemplateRenderer
from verl_ext.core.text_cut import (
    TEXT_CUT_MIN_CHARS,
    parallel_threads,
    text_cut_eligible,
    text_cuts,
)
from verl_ext.core.text_only_tokenizer import text_only_tokenizer
from verl_ext.core.tokenizer_files import (
    check_token_ids,
    check_tokenizer_folder,
    explain_load_failure,
    read_template_file,
    refuse_unparsable,
    template_origin,
    template_variables,
)

if TYPE_CHECKING:  # transformers takes seconds to import; what only reads records (the report) never needs it
    from transformers import PreTrainedTokenizerBase

Message = Mapping[str, Any]

# Roles whose text is untrusted: it comes from people, tools or the environment, not the policy.
DEFAULT_ESCAPED_ROLES: tuple[str, ...] = ("user", "tool", "system")

# ASCII, so that templates which ``|tojson``, ``|trim`` or ``|string`` the content keep it intact.
log = logging.getLogger(__name__)

_PLACEHOLDER = "zqVXESC{}Xqz"

# Text at least this long is encoded in pieces cut at special tokens, in one parallel batch (``ChatRenderer.encode``).
# Below it the batch's thread hand-off costs more than it saves (measured on Qwen3 and Mistral renders).
PARALLEL_MIN_CHARS = 16_384
# ... and only when no piece between special tokens holds more than 1/PARALLEL_MAX_PIECE_SHARE of it: a few long
# pieces are unbalanced (one huge tool result is most of the text, and its piece alone takes the wall time), so such
# text goes to the plain-text cut, which balances it, where the tokenizer allows that cut (``_encode_text``). The
# rule was set when cutting 4-8 pieces measured 30% more CPU; re-measured 2026-11-26 (32k characters in k equal
# pieces, one batch on 2 threads) cutting costs less: Qwen3 0.44-0.47x the whole text's CPU, Mistral 0.83-1.02x at
# 0.42-0.48x its wall time. Mistral, which has no plain-text cut, still encodes such text whole: left to revisit.
PARALLEL_MAX_PIECE_SHARE = 32
# Pieces are joined into batch inputs of about this many characters (measured on Qwen3 and Mistral chats of 64
# turns: inputs of 1-4k characters beat one input per piece by 5-25% and the whole text by 20-50%, one thread).
PARALLEL_INPUT_CHARS = 4096
_PLACEHOLDER_RE = re.compile(r"zqVXESC(\d+)Xqz")


@dataclass(frozen=True)
class Escape:
    """A special-token string found in untrusted message content and encoded as plain text."""

    message_index: int
    role: str
    text: str


@dataclass(frozen=True)
class Rendered:
    """Token ids of one render, and the special-token strings that were kept as text.

    ``escape_divergence`` is empty when the escaped render's text is the template's own text (only the token
    split of the escaped strings differs); otherwise it says where the template treated the escaped content
    differently (a filter that changed it, a placeholder it dropped).
    """

    ids: tuple[int, ...]
    escapes: tuple[Escape, ...] = ()
    escape_divergence: str = ""
    text: str = field(default="", compare=False)  # the template's own text (unescaped), which ``ids`` encode


def load_renderer(
    tokenizer_dir: str | os.PathLike[str],
    chat_template_file: str | os.PathLike[str] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    escape_special_tokens: bool = True,
) -> ChatRenderer:
    """Load a tokenizer from a local folder (never from the Hub) and wrap it in a renderer. A damaged file in the
    folder, or a template that does not parse, raises an error naming the file (and line) and the fix."""
    path = check_tokenizer_folder(tokenizer_dir)
    template = None if chat_template_file is None else read_template_file(chat_template_file)
    try:
        tokenizer = load_tokenizer(path)
    except Exception as exc:  # transformers raises many types for a damaged file; each is traced to the file
        raise explain_load_failure(path, exc) from exc
    check_token_ids(path, tokenizer)
    origin = str(chat_template_file) if chat_template_file is not None else template_origin(path)
    if template is None and isinstance(tokenizer.chat_template, str):
        refuse_unparsable(tokenizer.chat_template, origin)
    elif template is None and isinstance(tokenizer.chat_template, Mapping):  # named templates
        for name, text in tokenizer.chat_template.items():
            if isinstance(text, str):
                refuse_unparsable(text, f"{origin}, template {name!r}")
    renderer = ChatRenderer(
        tokenizer,
        chat_template=template,
        template_kwargs=template_kwargs,
        escape_special_tokens=escape_special_tokens,
    )
    renderer.template_source = origin
    renderer.template_file = None if chat_template_file is None else str(chat_template_file)
    return renderer


def _cleans_up_spaces(tokenizer: Any, backend: Any) -> bool:
    """Whether transformers' decode changes the backend's text (``clean_up_tokenization_spaces``). Transformers 5
    ignores that flag for a BPE model unless forced, warning on the first decode (every Llama 3 folder sets it): the
    text is the backend's either way, so the backend decodes it, and the warning about a flag with no effect stays
    away from the audit."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    if backend is None:
        return True
    forced = getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    return type(backend.model).__name__ != "BPE" or bool(forced)


def _quiet(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """``tokenizer`` with ``clean_up_tokenization_spaces`` off where transformers ignores it (a BPE model): the same
    text from every decode (verl's tool parsers' too), without a warning per process about a flag with no effect."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    flag = getattr(tokenizer, "clean_up_tokenization_spaces", False)
    if backend is not None and flag and not _cleans_up_spaces(tokenizer, backend):
        tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


# Plain text every chat tokenizer encodes and decodes back unchanged (no space before punctuation, which
# ``clean_up_tokenization_spaces`` would legitimately remove).
ROUND_TRIP_TEXTS: tuple[str, ...] = ("Hello world, how are you?", "Line one.\nLine two:  two spaces.")


def round_trip_failures(tokenizer: PreTrainedTokenizerBase) -> list[tuple[str, str]]:
    """(text, what it decodes back to) for each plain text the tokenizer does not round-trip."""
    out = []
    for text in ROUND_TRIP_TEXTS:
        back = str(tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=False))
        if back != text:
            out.append((text, back))
    return out


def load_tokenizer(tokenizer_dir: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """``AutoTokenizer`` from a local folder, as its tokenizer.json defines it.

    transformers 5 rebuilds the normalizer, pre-tokenizer and decoder of a class named in tokenizer_config.json
    (``tokenizer_class``) instead of taking tokenizer.json's. A byte-level tokenizer.json whose config names
    ``LlamaTokenizerFast`` (DeepSeek V3/R1) then gets a Metaspace pre-tokenizer and decodes "Hello world" as
    "Helloworld" (huggingface/transformers#45488). When the loaded tokenizer does not round-trip plain text, the
    folder is loaded again with the generic class, which takes tokenizer.json as it is, and that one is used if
    it round-trips.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before the import: huggingface_hub reads it once
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = _quiet(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    failures = round_trip_failures(tokenizer)
    if not failures or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return tokenizer
    faithful = _quiet(PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir)))
    if round_trip_failures(faithful):
        return tokenizer  # the file itself does not round-trip: the probe reports it
    text, back = failures[0]
    log.warning(
        "verl_ext: %s loaded as %s decodes %r as %r (transformers replaced tokenizer.json's pre-tokenizer, "
        "huggingface/transformers#45488); using tokenizer.json as it is (%s) instead",
        tokenizer_dir,
        type(tokenizer).__name__,
        text,
        back,
        type(faithful).__name__,
    )
    return faithful


class ChatRenderer:
    """A tokenizer, its chat template and the template kwargs, with token-exact rendering.

    ``render(...)`` equals ``apply_chat_template(..., tokenize=True)`` token for token whenever no
    untrusted message contains special-token text; when one does, that text is encoded as plain
    text and reported in ``Rendered.escapes``.
    """

    # Where the template came from, named in render errors (``load_renderer`` sets the file, or the config key).
    template_source: str = "the chat template"
    # The template file given instead of the tokenizer's (``--chat-template``), or None: named in an audit's fix.
    template_file: str | None = None
    # The time ``strftime_now`` reads in this renderer's template (ISO 8601, local time as transformers' own
    # ``strftime_now`` reads it), or None for the wall clock. A rollout pins it at its start (``with_clock``).
    clock: str | None = None

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        escape_special_tokens: bool = True,
        escaped_roles: Sequence[str] = DEFAULT_ESCAPED_ROLES,
        _text_only: Tokenizer | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template: str | None = _one_template(chat_template or tokenizer.chat_template, tokenizer)
        if not self.chat_template:
            raise TemplateError(
                f"tokenizer {tokenizer.name_or_path!r} has no chat template; pass one with "
                "--chat-template FILE (or chat_template=...)"
            )
        if isinstance(self.chat_template, str):
            refuse_unparsable(self.chat_template)
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        self.escape_special_tokens = escape_special_tokens
        self.escaped_roles = tuple(escaped_roles)
        added = tokenizer.added_tokens_decoder
        self.added_ids: frozenset[int] = frozenset(added)
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)
        template = self.chat_template or ""
        written = {i for i, tok in added.items() if tok.content.strip() and tok.content in template}
        # Structural tokens: what a turn can open or close on. Special tokens, and added tokens flagged non-special
        # that have their shape (a family may ship every <|role|> marker as a plain added token): the same
        # distinctive delimiters as a special token or one the template writes (see ``marker_shape``).
        shapes = {marker_shape(added[i].content) for i in self.special_ids | written} - {None}
        self.structural_ids: frozenset[int] = self.special_ids | frozenset(
            i for i, tok in added.items() if marker_shape(tok.content) in shapes
        )
        # Control tokens: what could open or close a turn, never created by message text. Structural tokens, and
        # added tokens the template itself writes (Qwen's non-special <tool_call>). Not every added token: Gemma
        # holds thousands of plain ones (HTML tags, whitespace runs) that are ordinary text in a message.
        self.control_ids: frozenset[int] = self.structural_ids | frozenset(written)
        strings = {added[i].content for i in self.control_ids if added[i].content}
        self._added_re = re.compile(literal_alternation(strings)) if strings else None  # the longest where several
        self._text_only = _text_only or text_only_tokenizer(tokenizer)

    @property
    def control_pattern(self) -> re.Pattern[str] | None:
        """A pattern matching the text of every control token (longest first); None when there is none."""
        return self._added_re

    def with_template_kwargs(self, template_kwargs: Mapping[str, Any] | None) -> ChatRenderer:
        """The same tokenizer and template with other template kwargs (shares the loaded tokenizers)."""
        if dict(template_kwargs or {}) == self.template_kwargs:
            return self
        clone = copy.copy(self)
        clone.template_kwargs = dict(template_kwargs or {})
        clone.__dict__.pop("fingerprint", None)
        clone.__dict__.pop("_template", None)  # verified again with the new kwargs
        return clone

    @functools.cached_property
    def reads_clock(self) -> bool:
        """Whether the template can stamp the time it is rendered at (``strftime_now``: today's date)."""
        return "strftime_now" in (self.chat_template or "")

    def with_clock(self, clock: str | datetime.datetime | None) -> ChatRenderer:
        """The same renderer with ``strftime_now`` reading ``clock`` (a datetime or its ISO 8601 text; None: the wall
        clock). Every render of one rollout, and its re-render in the check and in replay, must read one time: a
        rollout that crosses midnight would otherwise see one date in its prompt and another in the re-render. The
        fingerprint is unchanged (the probe's facts do not depend on the date). A clock that is not ISO 8601 is a
        ``TemplateError`` naming it."""
        text = clock.isoformat() if isinstance(clock, datetime.datetime) else clock
        if text == self.clock:
            return self
        if text is not None:
            parse_clock(text)
        clone = copy.copy(self)
        clone.clock = text
        clone.__dict__.pop("_template", None)
        return clone

    def pinned(self) -> ChatRenderer:
        """This renderer with its clock pinned to now, when its template reads the clock and no clock is pinned yet
        (otherwise itself): what one rollout renders with."""
        if self.clock is not None or not self.reads_clock:
            return self
        return self.with_clock(datetime.datetime.now().replace(microsecond=0))

    def with_chat_template(self, chat_template: str) -> ChatRenderer:
        """The same tokenizer with another chat template (shares the loaded tokenizers; control ids re-derived)."""
        return ChatRenderer(
            self.tokenizer,
            chat_template,
            self.template_kwargs,
            self.escape_special_tokens,
            self.escaped_roles,
            _text_only=self._text_only,
        ).with_clock(self.clock)

    # -- identity ---------------------------------------------------------------------------------
    @functools.cached_property
    def _tokenizer_hash(self) -> Any:
        """sha256 over the tokenizer's serialization, once per tokenizer (about a second for a 150k vocabulary): both
        fingerprints continue from it."""
        return hashlib.sha256(self.tokenizer.backend_tokenizer.to_str().encode())

    @property
    def tokenizer_fingerprint(self) -> str:
        """Stable id of the tokenizer alone (vocabulary, merges, added tokens): what decoding ids depends on."""
        return self._tokenizer_hash.hexdigest()[:16]

    @functools.cached_property
    def fingerprint(self) -> str:
        """Stable id of (tokenizer, template, template kwargs): the probe's cache key."""
        h = self._tokenizer_hash.copy()
        h.update((self.chat_template or "").encode())
        h.update(json.dumps(self.template_kwargs, sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    @property
    def name(self) -> str:
        """The tokenizer's ``name_or_path`` (its folder, for a tokenizer loaded from one)."""
        return str(self.tokenizer.name_or_path)

    @functools.cached_property
    def vocab_size(self) -> int:
        """Ids the tokenizer can decode (added tokens included): an engine id at or past it is no token. Cached:
        ``len(tokenizer)`` takes a few hundred milliseconds in transformers 5."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return int(backend.get_vocab_size(with_added_tokens=True))
        return len(self.tokenizer)

    # -- rendering --------------------------------------------------------------------------------
    @functools.cached_property
    def _template(self) -> ChatTemplateRenderer:
        """``apply_chat_template(tokenize=False)`` for this template and kwargs (faster Jinja once verified)."""
        kwargs = self.template_kwargs
        if self.clock is not None:
            # A template variable shadows transformers' global of the same name: the template reads this time.
            kwargs = {**kwargs, "strftime_now": _fixed_strftime(parse_clock(self.clock))}
        return ChatTemplateRenderer(self.tokenizer, self.chat_template or "", kwargs)

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages``; template errors become ``TemplateError``."""
        try:
            tool_list = list(tools) if tools else None
            text = self._template.render([dict(m) for m in messages], tool_list, add_generation_prompt)
        except Exception as exc:  # jinja raises many types; all mean "this template refused"
            roles = [m.get("role") for m in messages]
            why = " ".join(str(exc).split())  # one line, whatever the template's message holds
            raise TemplateError(
                f"{self.template_source}: chat template failed to render roles {roles}: {why}{self._missing_kwarg(exc)}"
            ) from exc
        assert isinstance(text, str)
        return text

    def _missing_kwarg(self, exc: Exception) -> str:
        """The fix for a template that reads a variable from its caller that it was not given (firefunction-v2's
        ``functions`` and ``datetime``): pass it as a template kwarg. Empty for any other error."""
        import jinja2

        match = re.fullmatch(r"'(\w+)' is undefined", str(exc))
        if not isinstance(exc, jinja2.UndefinedError) or match is None:
            return ""
        name = match.group(1)
        if name in self.template_kwargs or name not in template_variables(self.chat_template or ""):
            return ""
        return (
            f"; the template reads {name!r} from its caller and was not given it: pass it as a template kwarg "
            f"(verl-ext: --template-kwargs '{{\"{name}\": ...}}'; training: data.apply_chat_template_kwargs)"
        )

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        escape: bool | None = None,
    ) -> Rendered:
        """Render and encode ``messages``. ``escape`` defaults to the renderer's setting."""
        escape = self.escape_special_tokens if escape is None else escape
        if not escape or self._added_re is None:
            text = self.render_text(messages, tools, add_generation_prompt)
            return Rendered(tuple(self.encode(text)), text=text)
        protected, literals, escapes = self._protect(messages)
        text = self.render_text(protected, tools, add_generation_prompt)
        if not literals:  # nothing was swapped: ``protected`` is ``messages``
            return Rendered(tuple(self.encode(text)), text=text)
        plain = self.render_text(messages, tools, add_generation_prompt)
        ids = tuple(self._encode_with_literals(text, literals))
        divergence = self._escape_divergence(text, literals, plain)
        if not divergence and self.decode(ids) != self.decode(self.encode(plain)):
            divergence = "the escaped pieces, encoded apart, decode to other text than the template's"
        return Rendered(ids, tuple(escapes), divergence, text=plain)

    def encode(self, text: str) -> list[int]:
        """Encode rendered template text; special-token strings become special tokens.

        The ids of ``tokenizer.encode(text, add_special_tokens=False)``. On a fast tokenizer whose backend has no
        truncation, padding or special-token splitting set (what that call sets before encoding), the backend
        encodes directly and without character offsets: the same ids, 10-60% sooner on long text (the check's
        full render, each turn's new content). Where the tokenizers library runs a batch on more than one thread
        (``TOKENIZERS_PARALLELISM``, ``parallel_threads``), long text is cut where the tokenizer provably cuts it
        too and the pieces are encoded in one batch call, spread over those threads: the same ids, less wall time
        where a core is free. Text of at least ``PARALLEL_MIN_CHARS`` characters made of many short pieces (a
        multi-turn conversation) is cut at special-token strings (``_chunking``), at no more CPU time (measured);
        other text of at least ``TEXT_CUT_MIN_CHARS`` characters (one long tool output) into one piece per thread,
        each cut just before the space of a ``[a-z] [a-z]``, on byte-level BPE tokenizers with a known
        pre-tokenizer pattern (``verl_ext.core.text_cut``). Any other tokenizer encodes the text whole.
        """
        backend = self._backend
        if (
            backend is not None
            and backend.truncation is None
            and backend.padding is None
            and not backend.encode_special_tokens
        ):
            if len(text) >= PARALLEL_MIN_CHARS and self._chunking is not None:
                return self._encode_chunked(text, *self._chunking)
            return self._encode_text(backend, text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_text(self, backend: Tokenizer, text: str) -> list[int]:
        """``text`` encoded whole, or, where that is provably the same and more than one thread encodes a batch, cut
        into one piece per thread encoded in one batch (``verl_ext.core.text_cut``)."""
        threads = parallel_threads() if len(text) >= TEXT_CUT_MIN_CHARS else 1
        cuts = text_cuts(text, threads) if threads > 1 else []
        if cuts and not self._text_cut:  # (finding the cuts costs less than reading the tokenizer's state)
            cuts = []
        if not cuts:
            return backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
        bounds = [0, *cuts, len(text)]
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        ids: list[int] = []
        for encoding in backend.encode_batch_fast(pieces, add_special_tokens=False):
            ids += encoding.ids
        return ids

    def _encode_chunked(self, text: str, cuts: re.Pattern[str], continuation: Tokenizer | None) -> list[int]:
        """``text`` cut at matches of ``cuts`` (special-token strings), the pieces encoded in one batch. With a
        Metaspace pre-tokenizer that marks only the input's start ("first"), every input but the first is encoded
        by ``continuation`` (which never marks it), as the whole text's encoding treats what does not start it."""
        backend = self._backend
        assert backend is not None
        parts = cuts.split(text)  # [text, token, text, token, ..., text]: the pattern captures each cut
        if max(map(len, parts)) * PARALLEL_MAX_PIECE_SHARE > len(text):
            # A few long pieces (one huge tool result; see PARALLEL_MAX_PIECE_SHARE): cut in plain text into one
            # piece per thread where that is provably the same (measured on 8k-character tool outputs, Qwen3 and
            # Qwen2.5: its pieces encoded one after the other cost 0.95x the whole text's CPU), else encoded whole.
            return self._encode_text(backend, text)
        # Adjacent pieces joined into inputs of about PARALLEL_INPUT_CHARS (any cut between two of them is one the
        # tokenizer makes): one input per piece costs more than it saves on a chat of short turns (measured).
        inputs: list[str] = []
        joined: list[str] = []
        size = 0
        for part in parts:
            joined.append(part)
            size += len(part)
            if size >= PARALLEL_INPUT_CHARS:
                inputs.append("".join(joined))
                joined, size = [], 0
        if joined:
            inputs.append("".join(joined))
        if continuation is None:
            encodings = backend.encode_batch_fast(inputs, add_special_tokens=False)
        else:  # the first input starts the text, as the whole text does; the others continue it
            encodings = backend.encode_batch_fast(inputs[:1], add_special_tokens=False)
            encodings += continuation.encode_batch_fast(inputs[1:], add_special_tokens=False)
        ids: list[int] = []
        for encoding in encodings:
            ids += encoding.ids
        return ids

    @functools.cached_property
    def _backend(self) -> Tokenizer | None:
        """The fast tokenizer's backend, when it can encode without offsets and the wrapper adds nothing."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_batch_fast"):
            return None
        if getattr(self.tokenizer, "split_special_tokens", False):
            return None
        return backend

    @property
    def _chunking(self) -> tuple[re.Pattern[str], Tokenizer | None] | None:
        """(the special-token strings to cut text at, the continuation tokenizer or None), when cutting the text
        there and encoding the pieces apart gives the whole text's ids for certain; None otherwise (``_plans``)."""
        plans = self._plans
        return None if plans is None else plans[0]

    @property
    def _text_cut(self) -> bool:
        """Whether cutting plain text before the space of a ``[a-z] [a-z]`` gives the whole text's ids for certain
        (``text_cut_eligible``; ``_plans``). Added tokens can only make the answer no, so a tokenizer whose
        components already rule the cut out (Mistral's Metaspace) is answered from those (about 2 µs) without
        reading its added tokens (0.19 ms with Mistral's 771, paid by every encode of 1,024 characters or more)."""
        backend = self._backend
        if backend is None:
            return False
        try:
            components = components_key(backend)
        except Exception:  # a custom Python component cannot be serialised (its error type varies): encode whole
            return False
        cached = self.__dict__.get("_components_cut_cache")
        if cached is None or cached[0] != components:
            spec = light_spec(backend, with_added_tokens=False)
            cached = (components, spec is not None and text_cut_eligible(spec))
            self.__dict__["_components_cut_cache"] = cached
        if not cached[1]:
            return False
        plans = self._plans
        return plans is not None and plans[1]

    @property
    def _plans(self) -> tuple[tuple[re.Pattern[str], Tokenizer | None] | None, bool] | None:
        """(the chunking plan, whether plain text may be cut) for the backend as it is now; None without a backend or
        with a component that cannot be read. Made again when the tokenizer has changed since (a token added later
        could run into a cut)."""
        backend = self._backend
        if backend is None:
            return None
        # Keyed by everything the plans read: the added tokens (AddedToken equality compares their flags too: a token
        # re-added with rstrip keeps the count), the normalizer's, pre-tokenizer's and post-processor's state, the
        # model's kind and dropout. 0.19 ms with Mistral's 771 added tokens (2026-11-26), where serialising them took
        # 1.8 ms; ``_text_cut`` asks the components first, so only a tokenizer they allow the cut pays it per encode.
        try:
            key = (backend.get_added_tokens_decoder(), *components_key(backend))
        except Exception:  # a custom Python component cannot be serialised (its error type varies): encode whole
            return None
        cached = self.__dict__.get("_plans_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        spec = light_spec(backend)
        plan = None if spec is None else chunking_plan(spec)
        made: tuple[re.Pattern[str], Tokenizer | None] | None = None
        if plan is not None and not plan[1]:
            made = (plan[0], None)
        elif plan is not None:
            continuation = json.loads(backend.to_str())
            if no_start_marker(continuation.get("pre_tokenizer")):
                made = (plan[0], Tokenizer.from_str(json.dumps(continuation)))
        plans = (made, spec is not None and text_cut_eligible(spec))
        self.__dict__["_plans_cache"] = (key, plans)
        return plans

    def encode_as_text(self, text: str) -> list[int]:
        """Encode ``text`` so that special-token strings inside it stay plain text."""
        return self._text_only.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens included (never skipped: the check compares them too).

        ``tokenizer.decode(ids, skip_special_tokens=False)``; where that call is the backend's decode with nothing
        after it (a fast tokenizer that keeps transformers' own decode and does not clean up spaces), the backend
        decodes directly: transformers first converts every id through a generic Python check, which costs more
        than the decoding on a long stream.
        """
        if self._decoder is not None:
            return self._decoder.decode(list(ids), skip_special_tokens=False)
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def decode_many(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        """``[self.decode(ids) for ids in sequences]``, in one backend call where ``decode`` uses the backend: its
        batch decode runs the sequences on the free cores (when ``TOKENIZERS_PARALLELISM`` allows), and the check
        decodes several long thinking blocks at once."""
        if self._decoder is not None:
            return list(self._decoder.decode_batch([list(ids) for ids in sequences], skip_special_tokens=False))
        return [self.decode(ids) for ids in sequences]

    @functools.cached_property
    def decode_joins(self) -> bool:
        """``decode(a + b) == decode(a) + decode(b)`` wherever neither side's text shows a cut character (U+FFFD at
        the cut): the backend decodes bytes (a ByteLevel decoder alone), so a text is its pieces' texts joined. A
        SentencePiece decoder is not: it drops the space that starts a piece."""
        if self._decoder is None or self._decoder.decoder is None:
            return False
        return json.loads(self._decoder.decoder.__getstate__()).get("type") == "ByteLevel"

    @functools.cached_property
    def _decoder(self) -> Tokenizer | None:
        """The backend, when ``tokenizer.decode`` is exactly its decode (see ``decode``); else None."""
        from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

        kind = type(self.tokenizer)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if (
            backend is None
            or not isinstance(self.tokenizer, PreTrainedTokenizerFast)
            or kind.decode is not PreTrainedTokenizerBase.decode
            or kind._decode is not PreTrainedTokenizerFast._decode
            or _cleans_up_spaces(self.tokenizer, backend)
        ):
            return None
        return backend

    # -- escaping ---------------------------------------------------------------------------------
    def escapes(self, messages: Sequence[Message]) -> tuple[Escape, ...]:
        """The special-token strings in untrusted content that an escaping render would keep as text (no render)."""
        return () if self._added_re is None else tuple(self._protect(messages)[2])

    def escapes_text(self, role: str, text: str) -> bool:
        """Whether an escaping render would keep special-token text in ``text`` of a ``role`` message as text."""
        return (
            self.escape_special_tokens
            and self._added_re is not None
            and role in self.escaped_roles
            and self._added_re.search(text) is not None
        )

    def _protect(self, messages: Sequence[Message]) -> tuple[list[dict[str, Any]], list[str], list[Escape]]:
        """Swap special-token strings in untrusted content for ASCII placeholders."""
        assert self._added_re is not None
        literals: list[str] = []
        escapes: list[Escape] = []
        out: list[dict[str, Any]] = []

        def swap(text: str, index: int, role: str) -> str:
            def one(match: re.Match[str]) -> str:
                literals.append(match.group(0))
                escapes.append(Escape(index, role, match.group(0)))
                return _PLACEHOLDER.format(len(literals) - 1)

            return self._added_re.sub(one, text)  # type: ignore[union-attr]

        for index, message in enumerate(messages):
            msg = dict(message)
            role = str(msg.get("role"))
            content = msg.get("content")
            if role in self.escaped_roles:
                if isinstance(content, str):
                    msg["content"] = swap(content, index, role)
                elif isinstance(content, list):
                    msg["content"] = [
                        {**part, "text": swap(part["text"], index, role)}
                        if isinstance(part, Mapping) and isinstance(part.get("text"), str)
                        else part
                        for part in content
                    ]
            out.append(msg)
        return out, literals, escapes

    def _escape_divergence(self, text: str, literals: Sequence[str], plain: str) -> str:
        """Empty when ``text`` with its placeholders put back is the plain render's text; else what differs."""
        found = [int(m.group(1)) for m in _PLACEHOLDER_RE.finditer(text)]
        restored = _PLACEHOLDER_RE.sub(lambda m: literals[int(m.group(1))], text)
        if restored == plain and sorted(found) == list(range(len(literals))):
            return ""
        if sorted(found) != list(range(len(literals))):
            return (
                f"the template rendered {len(found)} of the {len(literals)} escaped strings as given (it transformed "
                "or dropped the others); the escaped text is not the template's"
            )
        k = next(
            (i for i, (a, b) in enumerate(zip(restored, plain, strict=False)) if a != b), min(len(restored), len(plain))
        )
        return (
            f"the template treats the escaped content differently at character {k}: escaped render "
            f"{restored[max(0, k - 20) : k + 20]!r}, plain render {plain[max(0, k - 20) : k + 20]!r}"
        )

    def _encode_with_literals(self, text: str, literals: Sequence[str]) -> list[int]:
        """Encode ``text`` piece by piece, each escaped literal as plain text. A piece that does not start the text
        is encoded as a continuation: a Metaspace pre-tokenizer that marks only the start of the input with "▁"
        (SentencePiece-style, prepend_scheme "first") would otherwise add a space before every piece."""
        ids: list[int] = []
        pos = 0
        mid = self._continuation
        for match in _PLACEHOLDER_RE.finditer(text):
            if match.start() > pos:
                piece = text[pos : match.start()]
                ids += (
                    self.encode(piece)
                    if pos == 0 or mid is None
                    else mid[0].encode(piece, add_special_tokens=False).ids
                )
            literal = literals[int(match.group(1))]
            if match.start() == 0 or mid is None:
                ids += self.encode_as_text(literal)
            else:
                ids += mid[1].encode(literal, add_special_tokens=False).ids
            pos = match.end()
        if pos < len(text):
            piece = text[pos:]
            ids += self.encode(piece) if pos == 0 or mid is None else mid[0].encode(piece, add_special_tokens=False).ids
        return ids

    @functools.cached_property
    def _continuation(self) -> tuple[Tokenizer, Tokenizer] | None:
        """(tokenizer, text-only tokenizer) that do not mark the start of their input, when the backend does."""
        spec = json.loads(self.tokenizer.backend_tokenizer.to_str())
        if not no_start_marker(spec.get("pre_tokenizer")):
            return None
        text_only = json.loads(self._text_only.to_str())
        no_start_marker(text_only.get("pre_tokenizer"))
        plain, literal = Tokenizer.from_str(json.dumps(spec)), Tokenizer.from_str(json.dumps(text_only))
        literal.encode_special_tokens = True
        return plain, literal


# Delimiter characters that do not make a marker's shape distinctive on their own: HTML tags (<table>, </div>) and
# bracketed words are ordinary added tokens in some vocabularies (Gemma), while <|...|> and <｜...｜> are markers.
_PLAIN_DELIMITERS = frozenset("<>/[]()")
_DELIMITER_RUN = re.compile(r"^([^\w\s]+)[\w\s▁.:-]*?([^\w\s]+)$")


def marker_shape(content: str) -> tuple[str, str] | None:
    """The delimiters of a marker-shaped token (``("<|", "|>")`` for ``<|im_end|>``, ``("<｜", "｜>")`` for
    DeepSeek's), or None when its delimiters are not distinctive (``<table>``, ``[INST]``, plain words)."""
    match = _DELIMITER_RUN.match(content)
    if match is None or not set(match.group(1) + match.group(2)) - _PLAIN_DELIMITERS:
        return None
    return match.group(1), match.group(2)


def parse_clock(text: str) -> datetime.datetime:
    """A pinned clock's ISO 8601 text as a datetime; a ``TemplateError`` naming the text otherwise."""
    try:
        return datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise TemplateError(
            f"template clock {text!r} is not an ISO 8601 time such as '2026-11-26T23:59:59' (the time a rollout's "
            "chat template read for strftime_now)"
        ) from None


def _fixed_strftime(now: datetime.datetime) -> Any:
    """``strftime_now`` as transformers defines it, reading ``now`` instead of the wall clock."""

    def strftime_now(format: str) -> str:  # noqa: A002 - the template calls it with this argument name
        return now.strftime(format)

    return strftime_now


def _one_template(template: Any, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The one template a renderer uses. A tokenizer with named templates (``[{"name": "default", ...},
    {"name": "tool_use", ...}]`` in tokenizer_config.json) is taken when it names only ``default``; otherwise
    transformers picks ``tool_use`` for a render with tools and ``default`` for one without, and a rollout rendered
    with one template cannot be compared with two, so the caller must choose."""
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, Mapping) and not template:
        return None
    if isinstance(template, Mapping):
        names = sorted(str(k) for k in template)
        if names == ["default"] and isinstance(template["default"], str):
            return template["default"]
        raise TemplateError(
            f"tokenizer {tokenizer.name_or_path!r} has named chat templates {names}; transformers chooses between "
            "them per call (tool_use with tools, default without), verl_ext renders a rollout with one: save the one "
            "your rollouts use to a .jinja file and pass --chat-template FILE (or chat_template=...)"
        )
    raise TemplateError(
        f"tokenizer {tokenizer.name_or_path!r} has a chat template of type {type(template).__name__}, not a string; "
        "pass one with --chat-template FILE (or chat_template=...)"
    )
