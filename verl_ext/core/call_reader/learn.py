"""Learn how a chat template writes tool calls, by rendering known calls (never by a model's name).

Assistant turns with calls of unique marker names and arguments are rendered: one call, two calls, one call after
content, one call with arguments of every JSON type. In each render the call is found (a JSON object holding the
name and the arguments; or the name followed by the arguments as JSON; or by keyed parameters), and the text around
it is compared across the renders: what precedes every call (``lead``), follows every call (``trail``), stands
between two calls, opens and closes the section, wraps the content. Where the template has a ``builtin_tools``
variable, a call of a tool declared built-in is rendered too: what precedes its Python call (``python_lead``). The
learned form must then read every probe render back into its own calls, or nothing is learned: a reason says why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.call_reader.form import ID_SLOT, JSON_CALL, NAME_JSON, NAME_KEYED, CallForm, Chunks
from verl_ext.core.call_reader.leftover import form_text_left
from verl_ext.core.call_reader.literals import MARKER, chunk_pattern, chunks, common_prefix, counted
from verl_ext.core.call_reader.read import CallReader, anchored
from verl_ext.core.errors import TemplateError
from verl_ext.core.tokenizer_files import template_variables

NAME_A, NAME_B = "qxtoola", "qxtoolb"
ARGS_A: dict[str, Any] = {"qxka": "QXVA1"}
ARGS_B: dict[str, Any] = {"qxkb": "QXVB2"}
ARGS_PAIR: dict[str, Any] = {"qxka": "QXVA1", "qxkb": "QXVB2"}
ARGS_TYPED: dict[str, Any] = {
    "qxka": "QXVA1",
    "qxkn": 7,
    "qxkr": 2.5,
    "qxkt": True,
    "qxkf": False,
    "qxkz": None,
    "qxko": {"qxa": [1, "QXS"]},
    "qxkl": ["QXL", 3],
}
CONTENT = "QXCONTENT"
_HEADS: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "system", "content": "QXSYSTEM"}, {"role": "user", "content": "QXUSERA"}),
    ({"role": "user", "content": "QXUSERA"},),
)
_TYPES = {"string": "QXVA1", "integer": 7, "number": 2.5, "boolean": True, "null": None, "object": {}, "array": []}


# The schema each probe parameter is declared with: valid JSON Schema a schema-expanding template can walk (arrays
# with ``items``, objects with ``properties``, a description each), and no ``"type": "null"``: Hermes' tool_use macro
# recurses without end on a type name it does not map (it iterates the string's letters), so the parameter the probe
# passes null is declared without a type (any value).
_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "null": {},
    "object": {"type": "object", "properties": {"qxa": {"type": "array", "items": {"type": "string"}}}},
    "array": {"type": "array", "items": {"type": "string"}},
}


def _schema(kind: str) -> dict[str, Any]:
    return {**_SCHEMAS[kind], "description": f"a probe {kind} parameter"}


def probe_tools() -> list[dict[str, Any]]:
    """The two tools the probe calls, with a parameter of each JSON type (schemas any template can expand)."""
    props = {k: _schema(_type_name(v)) for k, v in {**ARGS_TYPED, **ARGS_PAIR}.items()}
    return [
        {
            "type": "function",
            "function": {"name": n, "description": "probe", "parameters": {"type": "object", "properties": props}},
        }
        for n in (NAME_A, NAME_B)
    ]


def _type_name(value: Any) -> str:
    return next(t for t, v in _TYPES.items() if type(v) is type(value))


@dataclass(frozen=True)
class Learned:
    """A learned reader (``reader``), or None with ``why``; ``example`` is a probe render of calls, ``proof`` the
    calls the reader read back from it and ``content`` the content it read back (the template wrapped none: "";
    shown by ``verl-ext check-template``). ``failed``: a form was learned but its reading of the template's own
    renders is wrong (calls other than rendered, or call-marker text left in the content): a reader failure, not a
    template without readable calls."""

    reader: CallReader | None
    why: str = ""
    example: str = ""
    proof: tuple[tuple[str, Any], ...] = ()
    content: str = ""
    failed: bool = False


@dataclass(frozen=True)
class _Render:
    text: str  # generation prompt text + the turn's text
    calls: int  # calls asked for


@dataclass(frozen=True)
class _Span:
    start: int  # where the call starts (its JSON object, or its name)
    end: int  # where its arguments end
    mid: str = ""  # NAME_*: between the name and the arguments
    keys: tuple[str, str, str] = ("", "", "")  # JSON_CALL: name key, arguments key, id key


class _Learner:
    def __init__(self, renderer: Any, profile: Any) -> None:
        self.r = renderer
        self.profile = profile
        self.gen = renderer.decode(list(profile.generation_prompt_ids))
        self.shape = profile.tool_call_shape
        self.closes = [renderer.decode([i]) for i in sorted(profile.close_id_set)]

    def render(self, calls: Sequence[tuple[str, Mapping[str, Any]]], content: str = "") -> _Render | None:
        message = {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": f"call{n + 1:05d}", "type": "function", "function": {"name": name, "arguments": dict(args)}}
                for n, (name, args) in enumerate(calls)
            ],
        }
        message = self.shape.conform([message])[0]
        for head in _HEADS:
            try:
                prompt = self.r.render_text(list(head), probe_tools(), add_generation_prompt=True)
                full = self.r.render_text([*head, message], probe_tools(), add_generation_prompt=False)
            except TemplateError:
                continue
            at_p, at_f = prompt.rfind("QXUSERA"), full.rfind("QXUSERA")
            tail_p, tail_f = prompt[at_p:], full[at_f:]
            cut = len(os.path.commonprefix([tail_p, tail_f]))
            if cut < len(tail_p) and tail_f.rfind("<", 0, cut) > tail_f.rfind(">", 0, cut):
                cut = tail_f.rfind("<", 0, cut)  # never inside a tag the turn writes otherwise ("<think>")
            body = tail_f[cut:]
            last = max(body.rfind(m) for m in ("QXVA1", "QXVB2", "QXS", "QXL", NAME_A, NAME_B))
            ends = [body.find(c, last) for c in self.closes if c and body.find(c, last) >= 0]
            body = body[: min(ends)] if ends else body
            return _Render(self.gen + body, len(calls))
        return None

    def learn(self) -> Learned:
        one = self.render([(NAME_A, ARGS_A)])
        if one is None:
            return Learned(None, self.tools_failure() or "the template refuses an assistant turn with a tool call")
        if NAME_A not in one.text and "QXVA1" not in one.text:
            return Learned(None, f"the template renders nothing of a tool call ({self.shape.renders})")
        if "QXVA1" not in one.text:
            return Learned(None, "the template renders a call's name but not its arguments: no call can be read back")
        found = _locate(one.text, NAME_A, ARGS_A, "call00001", len(self.gen))
        if found is None:
            snippet = one.text[len(self.gen) :][:160]
            return Learned(None, f"the template writes a call in a form the reader does not know: {snippet!r}")
        encoding, first = found
        two = self.render([(NAME_A, ARGS_A), (NAME_B, ARGS_B)])
        second = None
        if two is not None and NAME_B in two.text and "QXVB2" in two.text:
            a = _locate(two.text, NAME_A, ARGS_A, "call00001", len(self.gen))
            b = _locate(two.text, NAME_B, ARGS_B, "call00002", a[1].end if a else len(self.gen))
            second = (a[1], b[1]) if a and b and a[0] == b[0] == encoding else None
        said = self.render([(NAME_A, ARGS_A)], CONTENT)
        content = None
        if said is not None and CONTENT in said.text:
            c = _locate(said.text, NAME_A, ARGS_A, "call00001", said.text.find(CONTENT) + len(CONTENT))
            content = c[1] if c and c[0] == encoding else None
        form = self.form(encoding, one, first, two if second else None, second, said if content else None, content)
        if isinstance(form, str):
            return Learned(None, form)
        reader = CallReader(form)
        example = two if second else one
        checks = [(one, [(NAME_A, ARGS_A)]), (example, [(NAME_A, ARGS_A), (NAME_B, ARGS_B)][: example.calls])]
        if content is not None and said is not None:
            checks.append((said, [(NAME_A, ARGS_A)]))
        typed = self.render([(NAME_A, ARGS_TYPED)])
        if typed is not None and "QXS" in typed.text:
            checks.append((typed, [(NAME_A, ARGS_TYPED)]))
        types = {n: {k: _type_name(v) for k, v in {**ARGS_TYPED, **ARGS_PAIR}.items()} for n in (NAME_A, NAME_B)}
        for render, want in checks:
            failure = self.read_back(reader, render, want, CONTENT if render is said else "", types)
            if failure is not None:
                return failure
        python = self.python_lead()
        if python is not None:
            lead, render = python
            reader = CallReader(dataclasses.replace(form, python_lead=lead))
            turn = reader.read(render.text[len(self.gen) :], types)
            got = [(c.name, json.loads(c.arguments)) for c in turn.calls]
            if got != [(NAME_A, ARGS_A)]:
                return Learned(
                    None,
                    f"the template's Python call of a built-in tool is not read back: "
                    f"{render.text[len(self.gen) :][:160]!r} read as {got}",
                )
        back = reader.read(example.text[len(self.gen) :], types)
        proof = tuple((c.name, json.loads(c.arguments)) for c in back.calls)
        return Learned(reader, "", example.text[len(self.gen) :], proof, back.content)

    def read_back(
        self,
        reader: CallReader,
        render: _Render,
        want: Sequence[tuple[str, Mapping[str, Any]]],
        wrapped: str,
        types: Mapping[str, Mapping[str, str]],
    ) -> Learned | None:
        """A failed ``Learned`` where ``reader`` reads ``render`` into other calls than ``want``, or leaves
        call-marker text in the content (anything of the form's own call text, beside the content ``wrapped``);
        None where it reads the render back exactly."""
        text = render.text[len(self.gen) :]
        turn = reader.read(text, types)
        got = [(c.name, json.loads(c.arguments)) for c in turn.calls]
        form = reader.form.describe()
        if got != want:
            why = f"the learned form ({form}) does not read the template's own render back: {text[:160]!r} read as "
            why += str(got)
            return Learned(None, why, text, tuple(got), turn.content, failed=True)
        named = text.find(NAME_A)
        markers = tuple(dict.fromkeys(MARKER.findall(text[named:]))) if named >= 0 else ()  # the calls' own
        left = form_text_left(reader.form, turn.content, wrapped, markers)
        if left:
            why = (
                f"the learned form ({form}) leaves call-marker text in the content: {left!r} in the read-back of "
                f"{text[:160]!r} (content read back: {turn.content[:120]!r})"
            )
            return Learned(None, why, text, tuple(got), turn.content, failed=True)
        return None

    def tools_failure(self) -> str | None:
        """Why the template fails where it renders the probe's tool schemas (the exception, and the parameter whose
        schema it fails on where one alone does), or None where it renders them."""
        head = [{"role": "user", "content": "QXUSERA"}]
        try:
            self.r.render_text(head, probe_tools(), add_generation_prompt=True)
            return None
        except TemplateError as exc:
            cause = exc.__cause__ or exc
            why = f"{type(cause).__name__}: {' '.join(str(cause).split())[:120]}"
        for key, value in {**ARGS_TYPED, **ARGS_PAIR}.items():
            kind = _type_name(value)
            tools = [
                {
                    "type": "function",
                    "function": {
                        "name": NAME_A,
                        "description": "probe",
                        "parameters": {"type": "object", "properties": {key: _schema(kind)}},
                    },
                }
            ]
            try:
                self.r.render_text(head, tools, add_generation_prompt=True)
            except TemplateError:
                return f"the template fails rendering the probe's tool schemas: {why} in parameter {key!r} ({kind})"
        return f"the template fails rendering the probe's tool schemas: {why}"

    def python_lead(self) -> tuple[Chunks, _Render] | None:
        """What the template writes before a call of a built-in tool in Python (``<|python_tag|>``), and its render:
        the probe's tools declared built-in through the template's ``builtin_tools`` variable (Llama 3.1-3.3); None
        where the template reads no such variable or writes no Python call for them."""
        if "builtin_tools" not in template_variables(self.r.chat_template or ""):
            return None
        builtin = self.r.with_template_kwargs({**self.r.template_kwargs, "builtin_tools": [NAME_A, NAME_B]})
        render = _Learner(builtin, self.profile).render([(NAME_A, ARGS_A)])
        if render is None:
            return None
        at = render.text.find(f"{NAME_A}.call(", len(self.gen))
        if at < 0:
            return None
        lead = tuple(chunks(render.text[len(self.gen) : at])) or tuple(chunks(render.text[:at]))[-1:]
        return (lead, render) if anchored(lead) is not None else None

    def around(
        self,
        one: _Render,
        first: _Span,
        two: _Render | None,
        pair: tuple[_Span, _Span] | None,
        said: _Render | None,
        content: _Span | None,
    ) -> tuple[Chunks, Chunks, Chunks, Chunks, Chunks, tuple[Chunks, Chunks, str] | None]:
        """The text around the calls: lead (before each call), trail (after each), sep (between two), closer (after
        the last), opener (before the first) and the content's wrap (the chunks before and after it, and the
        whitespace the template writes before it), from where the calls sit in each render."""
        g = len(self.gen)
        before_one = one.text[: first.start]  # the generation prompt included: a lead may start inside it
        heads = [before_one]
        between = ""
        if two is not None and pair is not None:
            between = two.text[pair[0].end : pair[1].start]
            heads.append(between)
        if said is not None and content is not None:
            heads.append(said.text[said.text.find(CONTENT) + len(CONTENT) : content.start])
        lead = _common_suffix([chunks(h) for h in heads])
        if len(heads) == 1:  # one render alone: the lead is what the turn writes before its call
            lead = tuple(chunks(before_one[g:])) or tuple(chunks(before_one))
        after_one = one.text[first.end :]
        tails = [chunks(after_one)]
        if between:
            tails.append(chunks(between))
            tails.append(chunks(two.text[pair[1].end :]))  # type: ignore[union-attr]
        trail = _common_prefix(tails) if between else tuple(chunks(after_one))
        sep: Chunks = ()
        if between:
            b = chunks(between)
            trail = trail[: max(0, len(b) - len(lead))]
            sep = tuple(b[len(trail) : len(b) - len(lead)])
        # the close after the last call, from every render: a template may close a section only after its second
        # call (DeepSeek V3's own template writes <｜tool▁calls▁end｜> after each call but the first)
        ends = [tuple(chunks(after_one)[len(trail) :])]
        if between:
            ends.append(tuple(chunks(two.text[pair[1].end :])[len(trail) :]))  # type: ignore[union-attr]
        if said is not None and content is not None:
            ends.append(tuple(chunks(said.text[content.end :])[len(trail) :]))
        closer = _longest_close(ends)
        turn_head = tuple(chunks(before_one[g:]))
        opener_from = chunks(heads[-1]) if said is not None and content is not None else turn_head
        opener = tuple(opener_from[: max(0, len(opener_from) - len(lead))])
        wrap = None
        if said is not None and content is not None and not turn_head[: max(0, len(turn_head) - len(lead))]:
            head = said.text[g : said.text.find(CONTENT)]
            pre = tuple(chunks(head))
            post = opener
            opener = ()
            wrap = (pre, post, head[len(head.rstrip()) :] if pre else "") if pre or post else None
        return lead, trail, sep, closer, opener, wrap

    def form(
        self,
        encoding: str,
        one: _Render,
        first: _Span,
        two: _Render | None,
        pair: tuple[_Span, _Span] | None,
        said: _Render | None,
        content: _Span | None,
    ) -> CallForm | str:
        """The form from where the calls sit in each render (a reason where the renders disagree)."""
        lead, trail, sep, closer, opener, wrap = self.around(one, first, two, pair, said, content)
        spans = [first, *(pair or ())]
        mids = [s.mid.replace(f"call{n:05d}", ID_SLOT) for n, s in zip((1, 1, 2), spans, strict=False)]
        mid = counted(mids)
        if mid is None:
            return f"the text between a call's name and its arguments differs between calls: {mids}"
        literals: dict[str, Any] = {}
        key_pre: Chunks = ()
        key_value: Chunks = ()
        value_post: Chunks = ()
        value_close = value_open = ""
        if encoding == NAME_KEYED:
            keyed = self.keyed()
            if isinstance(keyed, str):
                return keyed
            key_pre, key_value, value_post, literals, mid_chunks, value_close, value_open = keyed
            mid = "".join(mid_chunks)
        keys = first.keys
        return CallForm(
            encoding=encoding,
            generation_prompt=self.gen,
            opener=opener,
            lead=lead,
            trail=trail,
            sep=sep,
            closer=closer,
            mid=tuple(chunks(mid)) if encoding != NAME_KEYED else tuple(mid_chunks),
            name_key=keys[0],
            arguments_key=keys[1],
            id_key=keys[2],
            key_pre=key_pre,
            key_value=key_value,
            value_post=value_post,
            value_close=value_close,
            value_open=value_open,
            literals=literals,
            content_wrap=wrap[:2] if wrap else None,
            content_pad=wrap[2] if wrap else "",
            several=pair is not None,
        )

    def keyed(self) -> tuple[Chunks, Chunks, Chunks, dict[str, Any], Chunks, str, str] | str:
        """Keyed parameters: the text before a key, between key and value, after a value; the template's literals
        for true, false and null; the text between the name and the first key; and the close after a value as the
        template writes it, with its whitespace (the text after both values up to the next chunk); the whitespace it
        writes before a value."""
        two = self.render([(NAME_A, ARGS_PAIR)])
        if two is None:
            return "the template refuses a call with two parameters"
        t = two.text
        name_end = t.find(NAME_A) + len(NAME_A)
        ka, va = t.find("qxka", name_end), t.find("QXVA1", name_end)
        kb, vb = t.find("qxkb", va), t.find("QXVB2", va)
        if min(ka, va, kb, vb) < 0 or not ka < va < kb < vb:
            return "the template writes a call's parameters in an order or form the reader does not know"
        before_first, between, after = t[name_end:ka], t[va + 5 : kb], t[vb + 5 :]
        key_pre = _common_suffix([chunks(before_first), chunks(between)])
        value_post = _common_prefix([chunks(between), chunks(after)])
        key_value = tuple(chunks(t[ka + 4 : va]))
        mid = tuple(chunks(before_first))[: len(chunks(before_first)) - len(key_pre)]
        if not value_post:
            return "the template writes keyed parameters with nothing after a value: values cannot be delimited"
        literals: dict[str, Any] = {}
        typed = self.render([(NAME_A, ARGS_TYPED)])
        if typed is not None:
            reader_post = "".join(value_post)
            for key, value in ARGS_TYPED.items():
                if isinstance(value, bool) or value is None:
                    k = typed.text.find(key)
                    kv_end = typed.text.find("".join(key_value), k + len(key)) if key_value else k + len(key)
                    v_start = kv_end + len("".join(key_value))
                    v_end = typed.text.find(reader_post[:1] or "\n", v_start)
                    if k >= 0 and v_end > v_start:
                        literals[typed.text[v_start:v_end].strip()] = value
        close = re.match(r"\s*" + r"\s*".join(map(chunk_pattern, value_post)) + r"\s*", common_prefix([between, after]))
        opening = t[ka + 4 : va]
        value_open = opening[len(opening.rstrip()) :]
        return key_pre, key_value, value_post, literals, mid, close.group() if close else "", value_open


def _locate(text: str, name: str, args: Mapping[str, Any], call_id: str, start: int) -> tuple[str, _Span] | None:
    """Find the call of ``name`` with ``args`` in ``text`` from ``start``: its encoding and span."""
    at = text.find("{", start)
    decoder = json.JSONDecoder()
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            value, end = None, at
        if isinstance(value, dict):
            keys = _call_keys(value, name, args, call_id)
            if keys is not None:
                return JSON_CALL, _Span(at, end, keys=keys)
        at = text.find("{", at + 1)
    n = text.find(name, start)
    if n < 0:
        return None
    name_end = n + len(name)
    at = text.find("{", name_end)
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            value, end = None, at
        if value == dict(args):
            return NAME_JSON, _Span(n, end, mid=text[name_end:at])
        at = text.find("{", at + 1)
    keys = list(args)
    last_value = text.find(str(args[keys[-1]]), name_end)
    if all(text.find(k, name_end) >= 0 for k in keys) and last_value >= 0:
        post = text[last_value + len(str(args[keys[-1]])) :]
        stop = len(post) - len(post.lstrip())
        closing = post[stop:].split(">", 1)[0] + ">" if post[stop:].startswith("<") else ""
        first_key = text.find(keys[0], name_end)
        return NAME_KEYED, _Span(
            n, last_value + len(str(args[keys[-1]])) + stop + len(closing), mid=text[name_end:first_key]
        )
    return None


def _call_keys(obj: dict[str, Any], name: str, args: Mapping[str, Any], call_id: str) -> tuple[str, str, str] | None:
    name_key = next((k for k, v in obj.items() if v == name), None)
    args_key = next(
        (k for k, v in obj.items() if v == dict(args) or (isinstance(v, str) and _json_or_none(v) == dict(args))),
        None,
    )
    if name_key is None or args_key is None:
        return None
    id_key = next((k for k, v in obj.items() if v == call_id), "")
    return name_key, args_key, id_key


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _longest_close(ends: Sequence[Chunks]) -> Chunks:
    """The section close: the longest of the renders' ends after their last call where the others are its prefix
    (a close written after some renders' calls only), else the one-call render's."""
    longest = max(ends, key=len)
    return longest if all(longest[: len(e)] == e for e in ends) else ends[0]


def _common_suffix(lists: Sequence[Sequence[str]]) -> Chunks:
    out: list[str] = []
    for items in zip(*(list(reversed(x)) for x in lists), strict=False):
        if len(set(items)) != 1:
            break
        out.append(items[0])
    return tuple(reversed(out))


def _common_prefix(lists: Sequence[Sequence[str]]) -> Chunks:
    out: list[str] = []
    for items in zip(*lists, strict=False):
        if len(set(items)) != 1:
            break
        out.append(items[0])
    return tuple(out)


# A worker serves one template in practice; 64 leaves room for audits and tests, never grows with steps.
_CACHE: LruCache[tuple[str, tuple[int, ...]], Learned] = LruCache("derived call readers", 64)


def learn_call_reader(renderer: Any, profile: Any) -> Learned:
    """The call reader derived from ``renderer``'s template (cached per template and generation prompt)."""
    key = (renderer.fingerprint, tuple(profile.generation_prompt_ids))

    def learn() -> Learned:
        try:
            return _Learner(renderer, profile).learn()
        except TemplateError as exc:
            return Learned(None, f"the template's probe calls could not be rendered: {exc}")

    return _CACHE.get_or_make(key, learn)
