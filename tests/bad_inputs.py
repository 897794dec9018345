"""The new user's bad inputs, kept as a regression corpus: one table of every surface a user meets, each entry the
input and the one-line error or refusal it must get (stable substrings of it, and the exit code or HTTP status).

- ``CLI``: ``verl-ext`` argument lists (``shlex`` words; ``{placeholders}`` are filled by the test: ``{qwen3}``,
  ``{mistral}`` tokenizer folders, ``{tiny}`` a tiny Qwen3 model folder, ``{tmp}`` a scratch folder, ``{records}``
  a good record file, ``{bad:NAME}`` the file or folder ``BAD_FILES[NAME]`` builds), run in process through
  ``verl_ext.cli.main.main``: exit code and one line on stderr;
- ``OPTIONS``: ``verl_ext.*`` options as a user writes them: Hydra overrides (as ``verl-ext demo`` and verl's
  trainer take them) or a YAML config section, each refused with one ``OptionsError`` line;
- ``HTTP``: gateway requests on the chat-completions, Responses and Messages routes and the session endpoints,
  sent to one in-process app: status and one-line message in the route's error shape.

tests/cli/test_bad_inputs.py runs the first two, tests/gateway/test_gateway_bad_inputs.py the third; both assert what
every entry's answer must be: one line, no traceback, no Python repr of an object, a named fix.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Cli:
    """``verl-ext ARGS`` exits with ``code`` and one stderr line holding every one of ``says``."""

    args: str
    says: tuple[str, ...]
    code: int = 2


@dataclass(frozen=True)
class Option:
    """A ``verl_ext`` option refused with an ``OptionsError`` holding every one of ``says``: ``override`` a Hydra
    override (``verl_ext.check.mode=strikt``), or ``yaml`` a config whose ``verl_ext`` section is read."""

    says: tuple[str, ...]
    override: str | None = None
    yaml: str | None = None


@dataclass(frozen=True)
class Http:
    """``method`` ``path`` (``chat``, ``responses``, ``messages``, ``end``, ``open``, ``models`` under
    ``/sessions/{session}/...``, or a literal path starting with ``/``) with ``body`` (JSON, or ``raw`` bytes)
    answers ``status`` with a one-line message holding every one of ``says``."""

    path: str
    body: Any
    status: int
    says: tuple[str, ...]
    session: str = "s"
    method: str = "POST"
    raw: bytes | None = None


# Words a message uses to tell the fix (checked on every entry: an error that names the problem only is unclear).
FIX_WORDS = re.compile(
    r"\b(pass|send|use|set|leave|give|add|remove|write|start|open|shorten|quote|install|create|end (the|it)|"
    r"did you mean|e\.g\.|pick|run|fix|choose|must be|expected|see|serve|copy|save|delete|wait|upgrade|check the)\b",
    re.IGNORECASE,
)
# A Python object's repr (``<PIL.Image.Image object at 0x...>``, ``<class 'int'>``) or a traceback in a message.
NOT_FOR_USERS = re.compile(r"<[\w.]+ object at 0x|<class '|Traceback \(most recent call last\)|\bFile \"/")

LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4b0a1d47b0d2a1e8c2cbd5ed2e1a0c1bb5b4f6bb2c9d7a7f1d1f0e0a2b3c4d5e\nsize 11422654\n"
)


@dataclass(frozen=True)
class Scratch:
    """What a ``BAD_FILES`` builder may use: the scratch folder, the good record file's lines, the tokenizer
    folders."""

    tmp: Path
    record_lines: list[str]
    tokenizers: dict[str, Path]

    def copy_tokenizer(self, name: str, into: str, **files: str) -> Path:
        import shutil

        folder = self.tmp / into
        shutil.copytree(self.tokenizers[name], folder, ignore=shutil.ignore_patterns("extra_templates", "SOURCE.md"))
        for file, text in files.items():
            (folder / file.replace("__", ".")).write_text(text)
        return folder

    def lines(self, name: str, lines: list[str]) -> Path:
        path = self.tmp / name
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def edited(self, name: str, kind: str, edit: Callable[[dict[str, Any]], Any]) -> Path:
        """The good records with the first line of ``kind`` edited in place by ``edit``."""
        out, done = [], False
        for line in self.record_lines:
            obj = json.loads(line)
            if not done and obj.get("type") == kind:
                edit(obj)
                done = True
            out.append(json.dumps(obj))
        return self.lines(name, out)


def _pop(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: obj.pop(key)


def _put(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: obj.__setitem__(key, value)


def _png(width: int = 4, height: int = 4) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


# name -> the builder of a bad file or folder (``{bad:NAME}`` in a CLI entry)
BAD_FILES: dict[str, Callable[[Scratch], Path]] = {
    "empty.jsonl": lambda s: s.lines("empty.jsonl", []),
    "blank-lines.jsonl": lambda s: s.lines("blank-lines.jsonl", ["", "   "]),
    "not-json.jsonl": lambda s: s.lines("not-json.jsonl", ["rollout 1: ok"]),
    "truncated.jsonl": lambda s: _write_bytes(  # a killed writer: the last line cut, no newline after it
        s.tmp / "truncated.jsonl", "\n".join([*s.record_lines[:-1], s.record_lines[-1][:-40]]).encode()
    ),
    "bad-line.jsonl": lambda s: s.lines(
        "bad-line.jsonl", [*s.record_lines[:2], s.record_lines[2][:-40], *s.record_lines[3:]]
    ),
    "a-list.jsonl": lambda s: s.lines("a-list.jsonl", ["[1, 2, 3]"]),
    "no-type.jsonl": lambda s: s.lines("no-type.jsonl", ['{"rollout": 1}']),
    "other-type.jsonl": lambda s: s.lines("other-type.jsonl", ['{"type": "metrics", "step": 1}']),
    "header-only.jsonl": lambda s: s.lines("header-only.jsonl", s.record_lines[:1]),
    "schema-99.jsonl": lambda s: s.edited("schema-99.jsonl", "header", _put("schema", 99)),
    "no-check.jsonl": lambda s: s.edited("no-check.jsonl", "rollout", _pop("check")),
    "ids-as-text.jsonl": lambda s: s.edited("ids-as-text.jsonl", "rollout", _put("input_ids", "151644 872")),
    "no-messages.jsonl": lambda s: s.edited("no-messages.jsonl", "rollout", _pop("messages")),
    "binary.jsonl": lambda s: _write_bytes(s.tmp / "binary.jsonl", b"\x1f\x8b\x08\x00\xff\xfe\x00\x01"),
    "replay-no-messages.jsonl": lambda s: s.lines("replay-no-messages.jsonl", ['{"sampled": {"1": [1, 2]}}']),
    "replay-user-sampled.jsonl": lambda s: s.lines(
        "replay-user-sampled.jsonl", ['{"messages": [{"role": "user", "content": "hi"}], "sampled": {"0": [1]}}']
    ),
    "a-folder": lambda s: _folder(s.tmp / "a-folder"),
    "a-file": lambda s: _write_bytes(s.tmp / "a-file", b"just a file\n"),
    "empty-folder": lambda s: _folder(s.tmp / "empty-folder"),
    "lfs-tokenizer": lambda s: s.copy_tokenizer("qwen3", "lfs-tokenizer", tokenizer__json=LFS_POINTER),
    "truncated-tokenizer": lambda s: s.copy_tokenizer(
        "qwen3", "truncated-tokenizer", tokenizer__json=(s.tokenizers["qwen3"] / "tokenizer.json").read_text()[:5000]
    ),
    "config-not-json": lambda s: s.copy_tokenizer("qwen3", "config-not-json", tokenizer_config__json="{'eos': 1,"),
    "two-models": lambda s: s.copy_tokenizer(
        "mistral-7b-v0.3",
        "two-models",
        tokenizer_config__json=(s.tokenizers["qwen3"] / "tokenizer_config.json").read_text(),
        special_tokens_map__json=(s.tokenizers["qwen3"] / "special_tokens_map.json").read_text(),
    ),
    "eos-past-vocab": lambda s: s.copy_tokenizer(
        "mistral-7b-v0.3", "eos-past-vocab", generation_config__json='{"eos_token_id": [151645, 151643]}'
    ),
    "no-weights": lambda s: s.copy_tokenizer("qwen3", "no-weights", config__json='{"model_type": "qwen3"}'),
    "notes.txt": lambda s: _write_bytes(s.tmp / "notes.txt", b"Use the Kimi template for the agent runs.\n"),
    "broken.jinja": lambda s: _write_bytes(s.tmp / "broken.jinja", b"{% for message in messages %}{{ message }}\n"),
    "lfs.jinja": lambda s: _write_bytes(s.tmp / "lfs.jinja", LFS_POINTER.encode()),
}


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _folder(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


CLI: list[Cli] = [
    # the command line itself
    Cli("", ("the following arguments are required: command", "verl-ext --help")),
    Cli("chek-template {qwen3}", ("invalid choice: 'chek-template'", "did you mean 'check-template'")),
    Cli("check-template", ("required: tokenizer_dir", "verl-ext check-template --help")),
    Cli("check-template {qwen3} --jsn", ("unrecognized arguments: --jsn", "did you mean '--json'")),
    Cli("gateway", ("required: --model", "verl-ext gateway --help")),
    Cli("gateway --model {tiny} --port abc", ("argument --port: invalid int value: 'abc'",)),
    Cli("gateway --model {tiny} --modle x", ("unrecognized arguments: --modle x",)),
    Cli("report {records}", ("required: -o/--output",)),
    Cli("report {records} -o {tmp}/r.html --examples many", ("argument --examples: invalid int value: 'many'",)),
    Cli("replay {records}", ("required: --tokenizer",)),
    Cli("demo --loop react", ("argument --loop: invalid choice: 'react'", "'tool', 'gateway'")),
    Cli("demo --trainer v2", ("argument --trainer: invalid choice: 'v2'",)),
    Cli("demo --model llama", ("argument --model: invalid choice: 'llama'",)),
    Cli("demo --steps two", ("argument --steps: invalid int value: 'two'",)),
    # check-template: the tokenizer folder and its options
    Cli("check-template {tmp}/no-such-folder", ("no-such-folder", "does not exist")),
    Cli("check-template {bad:a-file}", ("a-file' is a file", "pass the folder")),
    Cli("check-template {bad:empty-folder}", ("empty-folder", "tokenizer.json")),
    Cli("check-template {bad:lfs-tokenizer}", ("tokenizer.json: a Git LFS pointer", "git lfs pull")),
    Cli("check-template {bad:truncated-tokenizer}", ("tokenizer.json",)),
    Cli("check-template {bad:config-not-json}", ("tokenizer_config.json",)),
    Cli("check-template {bad:two-models}", ("tokenizer_config.json", "different models")),
    Cli("check-template {bad:eos-past-vocab}", ("eos_token_id 151645 is past the vocabulary", "different models")),
    Cli("check-template {qwen3} --stop -1", ("--stop '-1'", "0 to 151668")),
    Cli("check-template {qwen3} --stop 999999", ("--stop '999999'", "0 to 151668")),
    Cli("check-template {qwen3} --stop 'two words'", ("--stop", "'two words'")),
    Cli("check-template {qwen3} --template-kwargs '{enable_thinking: false}'", ("--template-kwargs", "not valid JSON")),
    Cli("check-template {qwen3} --template-kwargs '[1]'", ("--template-kwargs must be a JSON object",)),
    Cli(
        "check-template {qwen3} --template-kwargs '{\"enable_thinkin\": false}'",
        ("never reads 'enable_thinkin'", "did you mean 'enable_thinking'"),
    ),
    Cli(
        "check-template {mistral} --template-kwargs '{\"enable_thinking\": false}'", ("never reads 'enable_thinking'",)
    ),
    Cli("check-template {qwen3} --chat-template {tmp}/missing.jinja", ("missing.jinja", "does not exist")),
    Cli("check-template {qwen3} --chat-template {bad:notes.txt}", ("never reads 'messages'",)),
    Cli("check-template {qwen3} --chat-template {bad:broken.jinja}", ("does not parse, line 1",)),
    Cli("check-template {qwen3} --chat-template {bad:lfs.jinja}", ("lfs.jinja: a Git LFS pointer", "git lfs pull")),
    Cli("check-template {qwen3} --chat-template {bad:a-folder}", ("a-folder", "folder")),
    Cli("check-template {qwen3} --html {bad:a-folder}", ("is a folder", "audit.html")),
    Cli("check-template {qwen3} --html {tmp}/no/audit.html", ("does not exist", "create it")),
    # gateway: every option checked before the weights load
    Cli("gateway --model {tmp}/no-such-model", ("no-such-model", "does not exist")),
    Cli("gateway --model {bad:a-file}", ("a-file' is a file", "pass the folder")),
    Cli("gateway --model {bad:no-weights}", ("holds no model weights", "--sglang-url")),
    Cli("gateway --model {tiny} --response-length 0", ("--response-length must be at least 1, got 0",)),
    Cli("gateway --model {tiny} --max-branches 0", ("--max-branches must be at least 1, got 0",)),
    Cli("gateway --model {tiny} --max-branches -3", ("--max-branches must be at least 1, got -3",)),
    Cli("gateway --model {tiny} --port 99999", ("--port 99999 is not a port", "pass 1-65535")),
    Cli("gateway --model {tiny} --port -1", ("--port -1 is not a port",)),
    Cli("gateway --model {tiny} --host 256.0.0.1", ("--host '256.0.0.1' is not",)),
    Cli("gateway --model {tiny} --records {bad:a-file}/records", ("--records", "records cannot be written")),
    Cli("gateway --model {tiny} --template-kwargs '{\"enable_thinkin\": 1}'", ("did you mean 'enable_thinking'",)),
    Cli("gateway --model {tiny} --template-kwargs 'thinking=false'", ("--template-kwargs", "not valid JSON")),
    Cli("gateway --model {tiny} --tokenizer {mistral}", ("is not the tokenizer of the model",)),
    Cli("gateway --model {tiny} --chat-template {tmp}/missing.jinja", ("missing.jinja", "does not exist")),
    Cli("gateway --model {tiny} --tool-parser nonsense", ("--tool-parser 'nonsense'", "hermes")),
    Cli("gateway --model {tiny} --sglang-url http://127.0.0.1:9", ("--sglang-url", "127.0.0.1:9")),
    Cli("gateway --model {tiny} --sglang-url localhost:30000", ("--sglang-url", "http://")),
    # report: the record files and the output
    Cli("report {tmp}/missing.jsonl -o {tmp}/r.html", ("missing.jsonl", "does not exist")),
    Cli("report {records} -o {bad:a-folder}", ("is a folder", "pass a file name")),
    Cli("report {records} -o {tmp}/no/r.html", ("does not exist", "create it")),
    Cli("report {records} -o {tmp}/r.html --examples -1", ("--examples must be 0 or more, got -1",)),
    Cli("report {bad:empty.jsonl} -o {tmp}/r.html", ("empty.jsonl",)),
    Cli("report {bad:blank-lines.jsonl} -o {tmp}/r.html", ("blank-lines.jsonl",)),
    Cli("report {bad:not-json.jsonl} -o {tmp}/r.html", ("not-json.jsonl:1", "not valid JSON")),
    Cli("report {bad:truncated.jsonl} -o {tmp}/r.html", ("truncated.jsonl:12: the last line is cut off", "remove")),
    Cli("report {bad:a-list.jsonl} -o {tmp}/r.html", ("a-list.jsonl:1",)),
    Cli("report {bad:no-type.jsonl} -o {tmp}/r.html", ("no-type.jsonl:1: not a verl_ext record",)),
    Cli("report {bad:other-type.jsonl} -o {tmp}/r.html", ("other-type.jsonl:1: not a verl_ext record",)),
    Cli("report {bad:header-only.jsonl} -o {tmp}/r.html", ("no rollout records", "header")),
    Cli("report {bad:schema-99.jsonl} -o {tmp}/r.html", ("schema-99.jsonl:1", "99")),
    Cli("report {bad:no-check.jsonl} -o {tmp}/r.html", ("no-check.jsonl:2", "has no 'check' object")),
    Cli("report {bad:bad-line.jsonl} -o {tmp}/r.html", ("bad-line.jsonl:3: not valid JSON", "records file")),
    Cli("report {bad:ids-as-text.jsonl} -o {tmp}/r.html", ("ids-as-text.jsonl:2", "input_ids")),
    Cli("report {bad:binary.jsonl} -o {tmp}/r.html", ("binary.jsonl",)),
    Cli("report {bad:a-folder} -o {tmp}/r.html", ("a-folder", "folder")),
    Cli("report {records} -o {tmp}/r.html --tokenizer {mistral}", ("the records were written with tokenizer",)),
    Cli("report {records} -o {tmp}/r.html --tokenizer {tmp}/no-tok", ("no-tok", "does not exist")),
    Cli("report examples/replay/qwen3_tool_call.jsonl -o {tmp}/r.html", ("qwen3_tool_call.jsonl:1",)),
    # replay
    Cli("replay {tmp}/missing.jsonl --tokenizer {qwen3}", ("missing.jsonl' does not exist",)),
    Cli("replay {bad:not-json.jsonl} --tokenizer {qwen3}", ("not-json.jsonl:1: not valid JSON",)),
    Cli("replay {bad:empty.jsonl} --tokenizer {qwen3}", ("empty.jsonl: no records",)),
    Cli("replay {bad:truncated.jsonl} --tokenizer {qwen3}", ("truncated.jsonl:12: the last line is cut off",)),
    Cli("replay {bad:replay-no-messages.jsonl} --tokenizer {qwen3}", ("replay-no-messages.jsonl:1", "messages")),
    Cli("replay {bad:replay-user-sampled.jsonl} --tokenizer {qwen3}", ("does not point at an assistant message",)),
    Cli("replay {bad:other-type.jsonl} --tokenizer {qwen3}", ("'metrics' is not a record type",)),
    Cli("replay {bad:schema-99.jsonl} --tokenizer {qwen3}", ("schema-99.jsonl:1", "99")),
    Cli("replay {bad:no-check.jsonl} --tokenizer {qwen3}", ("no-check.jsonl:2", "has no 'check' object")),
    Cli("replay {records} --tokenizer {tmp}/no-tok", ("no-tok", "does not exist")),
    Cli("replay {records} --tokenizer {qwen3} --stop -4", ("--stop '-4'",)),
    # demo: refused before the model, the data and the trainer
    Cli("demo --out {bad:a-file}", ("--out", "is a file, not a folder")),
    Cli("demo --steps 0 --out {tmp}/demo", ("--steps must be at least 1, got 0",)),
    Cli("demo --loop gateway --model qwen2.5-vl --out {tmp}/demo", ("runs with --loop tool only",)),
    Cli("demo --out {tmp}/demo 'verl_ext.extra_stop_tokens=[</tool_call>]'", ("Hydra cannot read", "Quote each")),
    Cli("demo --out {tmp}/demo verl_ext.check.mode=strikt", ("verl_ext.check.mode", "did you mean 'strict'")),
    Cli("demo --out {tmp}/demo +verl_ext.chek.mode=strict", ("unknown option verl_ext.chek", "verl_ext.check")),
    Cli("demo --out {tmp}/demo verl_ext.records.max_files=0", ("verl_ext.records.max_files must be a positive",)),
    Cli("demo --out {tmp}/demo verl_ext.harness.branches=every", ("verl_ext.harness.branches must be",)),
]

OPTIONS: list[Option] = [
    # verl_ext.check
    Option(("verl_ext.check.mode must be one of", "did you mean 'strict'"), override="verl_ext.check.mode=strikt"),
    Option(("verl_ext.check.mode must be one of",), override="verl_ext.check.mode=[warn]"),
    Option(("verl_ext.check.mode must be one of",), override="verl_ext.check.mode=1"),
    Option(("unknown option verl_ext.chek", "did you mean verl_ext.check"), override="+verl_ext.chek.mode=strict"),
    Option(
        ("unknown option verl_ext.check.moed", "did you mean verl_ext.check.mode"), override="verl_ext.check.moed=x"
    ),
    Option(("allowed_causes[0]", "did you mean 'bpe_remerge'"), override="verl_ext.check.allowed_causes=[bpe_remerg]"),
    Option(("allowed_causes must be 'default' or a list",), override="verl_ext.check.allowed_causes=bpe_remerge"),
    Option(("template_view_rate must be a finite number from 0 to 1",), override="verl_ext.check.template_view_rate=2"),
    Option(
        ("template_view_rate must be a number", "without quotes"), yaml="verl_ext: {check: {template_view_rate: '0.5'}}"
    ),
    Option(("logprob_atol must be a finite number",), override="verl_ext.check.logprob_atol=-1"),
    Option(
        ("template_view_budget_s must be a finite number more than 0",),
        override="verl_ext.check.template_view_budget_s=0",
    ),
    Option(("verl_ext.check must be a mapping",), yaml="verl_ext: {check: []}"),
    # verl_ext.records
    Option(("verl_ext.records.dir must be a folder path",), override="verl_ext.records.dir=5"),
    Option(("verl_ext.records.max_bytes must be a positive integer",), override="verl_ext.records.max_bytes=0"),
    Option(("verl_ext.records.max_bytes must be a positive integer",), override="verl_ext.records.max_bytes=64MB"),
    Option(("verl_ext.records.max_files must be a positive integer",), override="verl_ext.records.max_files=-1"),
    Option(("verl_ext.records.thumbnails must be true or false",), override="verl_ext.records.thumbnails=yes"),
    Option(
        ("unknown option verl_ext.records.maxbytes", "did you mean verl_ext.records.max_bytes"),
        override="verl_ext.records.maxbytes=1",
    ),
    Option(("verl_ext.records must be a mapping",), yaml="verl_ext: {records: false}"),
    Option(("verl_ext.records must be a mapping",), yaml="verl_ext: {records: /tmp/records}"),
    # top-level keys
    Option(("verl_ext.escape_special_tokens must be true or false",), override="verl_ext.escape_special_tokens=1"),
    Option(("verl_ext.tool_timeout_s must be a positive finite number",), override="verl_ext.tool_timeout_s=0"),
    Option(("verl_ext.tool_timeout_s must be a positive finite number",), override="verl_ext.tool_timeout_s=inf"),
    Option(("verl_ext.tool_timeout_s must be a positive finite number",), override="verl_ext.tool_timeout_s=30s"),
    Option(
        ("extra_stop_tokens must be a list of token strings",), yaml="verl_ext: {extra_stop_tokens: '</tool_call>'}"
    ),
    Option(("extra_stop_tokens[0] must be a token's text",), override="verl_ext.extra_stop_tokens=[1]"),
    Option(("extra_stop_tokens[0] must be a token's text",), override="verl_ext.extra_stop_tokens=['']"),
    Option(("Hydra cannot read the override", "Quote each string"), override="verl_ext.extra_stop_tokens=[<|im_end|>]"),
    Option(
        ("verl_ext.agent_name_column must be one of", "did you mean 'switch'"),
        override="verl_ext.agent_name_column=swtich",
    ),
    Option(
        ("unknown option verl_ext.tool_timeout", "did you mean verl_ext.tool_timeout_s"),
        override="verl_ext.tool_timeout=5",
    ),
    Option(("verl_ext must be a mapping of options", "hydra.searchpath"), yaml="verl_ext: strict"),
    Option(("verl_ext must be a mapping of options",), yaml="verl_ext: [strict]"),
    # verl_ext.harness
    Option(("harness.function must be module:function",), override="verl_ext.harness.function=run_agent"),
    Option(("harness.function must be a non-empty string",), override="verl_ext.harness.function=''"),
    Option(("both function", "set one"), yaml="verl_ext: {harness: {function: 'a:b', command: 'python run.py'}}"),
    Option(("harness.timeout_s must be a positive finite number",), override="verl_ext.harness.timeout_s=0"),
    Option(("harness.branches must be 'last'",), override="verl_ext.harness.branches=every"),
    Option(("harness.max_branches must be a positive integer",), override="verl_ext.harness.max_branches=0"),
    Option(
        ("unknown option verl_ext.harness.comand", "did you mean verl_ext.harness.command"),
        override="verl_ext.harness.comand=x",
    ),
    Option(("verl_ext.harness must be a mapping",), yaml="verl_ext: {harness: run.py}"),
    # verl_ext.numerics
    Option(("verl_ext.numerics.policy",), override="verl_ext.numerics.policy=loud"),
    Option(("verl_ext.numerics.depth_edges",), override="verl_ext.numerics.depth_edges=[8,2]"),
    Option(("verl_ext.numerics.refeed_fraction",), override="verl_ext.numerics.refeed_fraction=2"),
    Option(("unknown option verl_ext.numerics.drift",), override="verl_ext.numerics.drift=0.1"),
    Option(("verl_ext.numerics must be a mapping",), yaml="verl_ext: {numerics: 0.05}"),
]

TEXT = [{"role": "user", "content": "Hi"}]
PNG = base64.b64encode(_png()).decode()
DATA_URL = f"data:image/png;base64,{PNG}"


def _chat(**body: Any) -> dict[str, Any]:
    return {"model": "m", "messages": TEXT, "max_tokens": 4, **body}


def _responses(**body: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Hi", "max_output_tokens": 4, **body}


def _messages(**body: Any) -> dict[str, Any]:
    return {"model": "m", "messages": TEXT, "max_tokens": 4, **body}


def _image_message(url: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "text", "text": "See"}, {"type": "image_url", "image_url": {"url": url}}]}
    ]


CALC = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
SCHEMA = {"type": "object", "properties": {}}
RESPONSES_TOOL = {"type": "function", "name": "calc", "parameters": SCHEMA}
RESPONSES_CALL = {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": "{}"}
MESSAGES_TOOL = {"name": "calc", "input_schema": SCHEMA}


def _assistant(**message: Any) -> list[dict[str, Any]]:
    """A chat conversation whose middle turn is the assistant ``message`` (a user message answers it)."""
    return [*TEXT, {"role": "assistant", "content": "4", **message}, {"role": "user", "content": "?"}]


HTTP: list[Http] = [
    # the body itself
    Http("chat", None, 400, ("not UTF-8 JSON",), raw=b"{messages: []}"),
    Http("chat", None, 400, ("not UTF-8 JSON", "byte 14"), raw=b'{"messages": "\xff"}'),
    Http("chat", [1, 2], 400, ("must be a JSON object, got a list",)),
    Http("chat", {}, 400, ("'messages' must be a non-empty list",)),
    Http("chat", _chat(messages=[]), 400, ("'messages' must be a non-empty list",)),
    Http(
        "chat",
        None,
        400,
        ("lone UTF-16 surrogate", "send valid Unicode"),
        raw=b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    ),
    # chat completions: unknown and refused fields
    Http(
        "chat",
        _chat(temprature=0.5),
        400,
        ("'temprature' is not a chat-completions field", "did you mean 'temperature'"),
    ),
    Http("chat", _chat(max_token=8), 400, ("'max_token'", "did you mean 'max_tokens'")),
    Http(
        "chat",
        {"input": "Hi", "max_tokens": 4},
        400,
        ("'input' is not a chat-completions field", "did you mean 'messages'"),
    ),
    Http("chat", _chat(max_output_tokens=8), 400, ("'max_output_tokens'", "did you mean 'max_tokens'")),
    Http("chat", _chat(extra_body={"top_k": 5}), 400, ("'extra_body'", "leave it out")),
    Http("chat", _chat(reasoning={"effort": "high"}), 400, ("'reasoning' is not a chat-completions field",)),
    Http("chat", _chat(n=2), 400, ("'n' must be 1",)),
    Http("chat", _chat(logprobs=True), 400, ("'logprobs' is not supported",)),
    Http("chat", _chat(top_logprobs=5), 400, ("'top_logprobs' is not supported",)),
    Http("chat", _chat(logit_bias={"1": 5}), 400, ("'logit_bias' is not supported",)),
    Http("chat", _chat(min_p=0.1), 400, ("'min_p' is not supported",)),
    Http("chat", _chat(frequency_penalty=0.5), 400, ("'frequency_penalty' is not supported",)),
    Http("chat", _chat(presence_penalty=-1), 400, ("'presence_penalty' is not supported",)),
    Http("chat", _chat(modalities=["text", "audio"]), 400, ("'modalities' is not served",)),
    Http("chat", _chat(audio={"voice": "alloy"}), 400, ("'audio' is not served",)),
    Http("chat", _chat(prediction={"type": "content", "content": "x"}), 400, ("'prediction' is not served",)),
    Http("chat", _chat(verbosity="low"), 400, ("'verbosity' is not served",)),
    Http("chat", _chat(web_search_options={}), 400, ("'web_search_options' is not served",)),
    Http("chat", _chat(response_format={"type": "json_object"}), 400, ("only the text format is served",)),
    Http("chat", _chat(parallel_tool_calls=False), 400, ("'parallel_tool_calls': false is not served",)),
    # chat completions: sampling fields
    Http("chat", _chat(temperature=3), 400, ("'temperature' must be in [0, 2], got 3",)),
    Http("chat", _chat(temperature="0.7"), 400, ("'temperature' must be a number, got a string",)),
    Http("chat", _chat(top_p=0), 400, ("'top_p' must be in (0, 1]",)),
    Http("chat", _chat(top_k=0.5), 400, ("'top_k' must be an integer",)),
    Http("chat", _chat(top_k=-2), 400, ("'top_k' must be in [-1,",)),
    Http("chat", _chat(seed=2**64), 400, ("'seed' must be in",)),
    Http("chat", _chat(seed=True), 400, ("'seed' must be an integer, got a boolean",)),
    Http("chat", _chat(max_tokens=0), 400, ("'max_tokens' must be at least 1, got 0",)),
    Http("chat", _chat(max_tokens=-5), 400, ("'max_tokens' must be in",)),
    Http("chat", _chat(max_tokens=4096), 400, ("'max_tokens' is 4096", "tokens are left")),
    Http("chat", _chat(max_completion_tokens="8"), 400, ("'max_completion_tokens' must be an integer",)),
    Http("chat", _chat(repetition_penalty=0), 400, ("'repetition_penalty' must be in (0, 2]",)),
    Http("chat", _chat(reasoning_effort="max"), 400, ("'reasoning_effort' must be one of",)),
    Http(
        "chat",
        _chat(reasoning_effort="none"),
        400,
        ("asks for no reasoning", "enable_thinking=true", "--template-kwargs"),
    ),
    Http(
        "chat",
        _chat(stop=["a", "b", "c", "d", "e"]),
        400,
        ("'stop' must be a non-empty string or a list of at most 4",),
    ),
    Http("chat", _chat(stop="Hello world"), 400, ("'Hello world'", "tokens")),
    Http("chat", _chat(stop=""), 400, ("'stop' must be a non-empty string",)),
    Http("chat", _chat(stream="yes"), 400, ("'stream' must be true or false, got a string",)),
    Http("chat", _chat(stream_options=[]), 400, ("'stream_options' must be an object",)),
    Http(
        "chat",
        _chat(stream_options={"include_usage": "yes"}),
        400,
        ("'stream_options.include_usage' must be true or false",),
    ),
    Http(
        "chat",
        _chat(stream_options={"include_usge": True}),
        400,
        (
            "'stream_options.include_usge' is not a key of 'stream_options'",
            "did you mean 'stream_options.include_usage'",
        ),
    ),
    Http(
        "chat",
        _chat(stream_options={"include_obfuscation": True}),
        400,
        ("'stream_options.include_obfuscation' is not served", "set it false"),
    ),
    # chat completions: messages
    Http(
        "chat",
        _chat(messages=[{"role": "user", "content": "Hi", "cache_control": {"type": "ephemeral"}}]),
        400,
        ("'messages[0].cache_control' is not a key of a message of role 'user'", "its keys: 'role', 'content', 'name'"),
    ),
    Http(
        "chat",
        _chat(messages=_assistant(tool_call=[CALL])),
        400,
        ("'messages[1].tool_call'", "did you mean 'messages[1].tool_calls'"),
    ),
    Http(
        "chat",
        _chat(messages=[*_assistant(content="", tool_calls=[CALL])[:2], {"role": "tool", "tool_use_id": "c1"}]),
        400,
        ("'messages[2].tool_use_id' is not a key of a message of role 'tool'", "'tool_call_id'"),
    ),
    Http(
        "chat", _chat(messages=_assistant(refusal="No.")), 400, ("messages[1]", "an assistant 'refusal' is not served")
    ),
    Http("chat", _chat(messages=_assistant(audio={"id": "a1"})), 400, ("an assistant 'audio' is not served",)),
    Http("chat", _chat(messages=[{"role": "robot", "content": "Hi"}]), 400, ("unknown role 'robot'",)),
    Http("chat", _chat(messages=[{"content": "Hi"}]), 400, ("messages[0]", "role")),
    Http("chat", _chat(messages=["Hi"]), 400, ("messages[0]",)),
    Http("chat", _chat(messages=[{"role": "user", "content": 5}]), 400, ("messages[0]", "content")),
    Http(
        "chat",
        _chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]),
        400,
        ("content part 0 is 'input_audio'",),
    ),
    Http(
        "chat",
        _chat(messages=[*TEXT, {"role": "assistant", "content": "The answer is"}]),
        400,
        ("the last message is an assistant message",),
    ),
    Http(
        "chat",
        _chat(messages=[*TEXT, {"role": "tool", "content": "4", "tool_call_id": "c9"}]),
        400,
        ("tool_call_id 'c9' answers no tool call",),
    ),
    Http("chat", _chat(messages=[*TEXT, {"role": "tool", "content": "4"}]), 400, ("needs the 'tool_call_id'",)),
    Http(
        "chat",
        _chat(
            messages=[
                *TEXT,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": "{}"}}],
                },
                {"role": "user", "content": "?"},
            ]
        ),
        400,
        ("tool_calls[0]", "'id'"),
    ),
    Http(
        "chat",
        _chat(messages=[*TEXT, {"role": "function", "name": "calc", "content": "4"}]),
        400,
        ("answers no earlier assistant function_call",),
    ),
    # chat completions: tools
    Http("chat", _chat(tools={"calc": {}}), 400, ("'tools' must be a list of function tools, got an object",)),
    Http("chat", _chat(tools=[{"name": "calc"}]), 400, ("tools[0]", '"type": "function"')),
    Http(
        "chat",
        _chat(tools=[{"type": "function", "function": {"name": ""}}]),
        400,
        ("tools[0]", "'name' must be a non-empty string"),
    ),
    Http(
        "chat",
        _chat(tools=[{"type": "function", "function": {"name": "calc", "parameters": {"type": "array"}}}]),
        400,
        ("tools[0].function.parameters",),
    ),
    Http(
        "chat",
        _chat(tools=[{"type": "function", "function": {"name": "calc", "parameters": "{}"}}]),
        400,
        ("tools[0].function.parameters",),
    ),
    Http(
        "chat", _chat(tools=[CALC], tool_choice="required"), 400, ("tool_choice 'required' is not served", 'use "auto"')
    ),
    Http(
        "chat",
        _chat(tools=[CALC], tool_choice={"type": "function", "function": {"name": "calc"}}),
        400,
        ("is not served",),
    ),
    Http("chat", _chat(function_call="auto"), 400, ("'function_call' needs 'functions'",)),
    Http(
        "chat",
        _chat(tools=[CALC], functions=[CALC["function"]]),
        400,
        ("give 'tools' or the legacy 'functions', not both",),
    ),
    # chat completions: images
    Http("chat", _chat(messages=_image_message("https://example.com/cat.png")), 400, ("fetch",)),
    Http("chat", _chat(messages=_image_message("data:image/png;base64,AAAA")), 400, ("cannot be decoded",)),
    Http("chat", _chat(messages=_image_message("data:image/png;base64,!!!")), 400, ("base64",)),
    Http("chat", _chat(messages=_image_message("data:text/plain;base64,aGk=")), 400, ("text/plain",)),
    Http("chat", _chat(messages=_image_message(DATA_URL)), 400, ("takes no images",)),
    Http("chat", _chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400, ("without 'image_url'",)),
    Http(
        "chat",
        _chat(
            messages=[
                *TEXT,
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}]},
                {"role": "user", "content": "?"},
            ]
        ),
        400,
        ("in a 'assistant' message only text parts",),
    ),
    # the Responses route
    Http("responses", [], 400, ("must be a JSON object",)),
    Http("responses", _responses(input=[]), 400, ("'input' must be a string or a non-empty list",)),
    Http("responses", _responses(temprature=0.5), 400, ("'temprature'", "did you mean 'temperature'")),
    Http("responses", _responses(max_tokens=8), 400, ("'max_tokens'", "did you mean 'max_output_tokens'")),
    Http("responses", _responses(min_p=0.1), 400, ("'min_p'",)),
    Http(
        "responses",
        {"messages": [{"role": "user", "content": "Hi"}]},
        400,
        ("'messages' is not a Responses field", "did you mean 'input'"),
    ),
    Http("responses", _responses(reasoning_effort="low"), 400, ("did you mean 'reasoning'",)),
    Http(
        "responses",
        _responses(previous_response_id="resp_1"),
        400,
        ("'previous_response_id' is not served", "send the whole conversation"),
    ),
    Http("responses", _responses(conversation="conv_1"), 400, ("'conversation' is not served",)),
    Http("responses", _responses(background=True), 400, ("'background' is not served",)),
    Http("responses", _responses(max_tool_calls=2), 400, ("'max_tool_calls' is not served",)),
    Http("responses", _responses(top_logprobs=3), 400, ("'top_logprobs' is not served",)),
    Http("responses", _responses(truncation="auto"), 400, ("truncation 'auto' is not served",)),
    Http("responses", _responses(text={"format": {"type": "json_schema"}}), 400, ("only the text format is served",)),
    Http("responses", _responses(text={"verbosity": "low"}), 400, ("'text.verbosity' is not served",)),
    Http("responses", _responses(text={"formt": {}}), 400, ("'text.formt'", "did you mean 'text.format'")),
    Http("responses", _responses(reasoning="high"), 400, ("'reasoning' must be an object such as", "got a string")),
    Http("responses", _responses(reasoning={"effort": "none"}), 400, ("'reasoning.effort'", "asks for no reasoning")),
    Http(
        "responses",
        _responses(reasoning={"effort": "high", "summary": "auto", "level": 3}),
        400,
        ("'reasoning.level'",),
    ),
    Http("responses", _responses(temperature=2.5), 400, ("'temperature' must be in [0, 2]",)),
    Http("responses", _responses(max_output_tokens=0), 400, ("'max_output_tokens' must be in [1,",)),
    Http("responses", _responses(stream=1), 400, ("'stream' must be true or false",)),
    Http("responses", _responses(include="reasoning.encrypted_content"), 400, ("'include' must be a list of strings",)),
    Http(
        "responses",
        _responses(include=["reasoning.encrypted_content", "message.output_text.logprobs"]),
        400,
        ("include[1] 'message.output_text.logprobs' is not served", "logprobs"),
    ),
    Http("responses", _responses(include=["file_search_call.results"]), 400, ("include[0]", "no hosted tools")),
    Http(
        "responses",
        _responses(include=["reasoning.encrypted"]),
        400,
        ("include[0] 'reasoning.encrypted' is not a Responses includable", "'reasoning.encrypted_content'"),
    ),
    Http(
        "responses",
        _responses(tools=[{**RESPONSES_TOOL, "strictt": True}]),
        400,
        ("'tools[0].strictt' is not a key of a Responses function tool", "did you mean 'tools[0].strict'"),
    ),
    Http(
        "responses",
        _responses(tools=[RESPONSES_TOOL, {**RESPONSES_TOOL, "name": "calc2", "cache_control": {}}]),
        400,
        ("'tools[1].cache_control'", "its keys: 'type', 'name', 'description', 'parameters', 'strict'"),
    ),
    Http(
        "responses",
        _responses(input=[{"role": "user", "content": "Hi", "name": "ann"}]),
        400,
        ("'input[0].name' is not a key of a Responses message item",),
    ),
    Http(
        "responses",
        _responses(input=[*TEXT, {**RESPONSES_CALL, "parsed_arguments": {}}]),
        400,
        ("'input[1].parsed_arguments' is not a key of a Responses function_call item",),
    ),
    Http(
        "responses",
        _responses(
            input=[*TEXT, RESPONSES_CALL, {"type": "function_call_output", "call_id": "c1", "output": "4", "error": 1}]
        ),
        400,
        ("'input[2].error' is not a key of a Responses function_call_output item",),
    ),
    Http(
        "responses",
        _responses(input=[*TEXT, {"type": "reasoning", "text": "Hmm."}, {"role": "user", "content": "?"}]),
        400,
        ("'input[1].text' is not a key of a Responses reasoning item", "'summary'"),
    ),
    Http(
        "responses",
        _responses(input=[*TEXT, {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"}, *TEXT]),
        400,
        ("input[1]: encrypted reasoning cannot be read by the gateway",),
    ),
    Http("responses", _responses(tools=[{"type": "web_search"}]), 400, ("'web_search' tool", "only function tools")),
    Http(
        "responses",
        _responses(tools=[CALC]),
        400,
        ("tools[0]", "'name' must be a non-empty string", "move the 'function' object's keys up"),
    ),
    Http("responses", _responses(tool_choice="required"), 400, ("tool_choice 'required' is not served",)),
    Http("responses", _responses(input=[{"type": "item_reference", "id": "msg_1"}]), 400, ("'item_reference' item",)),
    Http("responses", _responses(input=[{"role": "robot", "content": "Hi"}]), 400, ("input[0].role must be one of",)),
    Http(
        "responses",
        _responses(input=[{"type": "function_call_output", "call_id": "c1", "output": "4"}]),
        400,
        ("call_id 'c1' answers no earlier function_call",),
    ),
    Http(
        "responses",
        _responses(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f1"}]}]),
        400,
        ("'input_file' part",),
    ),
    Http(
        "responses",
        _responses(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f1"}]}]),
        400,
        ("file ids are not served",),
    ),
    Http(
        "responses",
        _responses(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/cat.png"}]}]),
        400,
        ("fetch",),
    ),
    Http(
        "responses",
        _responses(input=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The"}]),
        400,
        ("the input ends with the assistant's turn",),
    ),
    # the Anthropic Messages route
    Http("messages", {"messages": TEXT}, 400, ("'max_tokens' is required", "send e.g. 1024")),
    Http("messages", _messages(max_tokens="8"), 400, ("'max_tokens' must be an integer",)),
    Http("messages", _messages(messages="Hi"), 400, ("'messages' must be a non-empty list",)),
    Http("messages", _messages(temprature=0.5), 400, ("'temprature'", "did you mean 'temperature'")),
    Http("messages", _messages(stop=["."]), 400, ("'stop'", "did you mean 'stop_sequences'")),
    Http("messages", _messages(temperature=1.5), 400, ("'temperature' must be in [0, 1]",)),
    Http("messages", _messages(max_completion_tokens=8), 400, ("did you mean 'max_tokens'",)),
    Http("messages", _messages(reasoning_effort="high"), 400, ("did you mean 'thinking'",)),
    Http("messages", _messages(output_config={"format": {"type": "json_schema"}}), 400, ("'output_config'",)),
    Http("messages", _messages(top_k=0.5), 400, ("'top_k' must be an integer",)),
    Http("messages", _messages(system=5), 400, ("system must be a string or a list of text blocks",)),
    Http(
        "messages",
        _messages(messages=[{"role": "system", "content": "Be brief."}, *TEXT]),
        400,
        ("messages[0].role must be 'user' or 'assistant'",),
    ),
    Http(
        "messages",
        _messages(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
        400,
        ("'document' block in a user message",),
    ),
    Http(
        "messages",
        _messages(
            messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}]}
            ]
        ),
        400,
        ("fetches no images",),
    ),
    Http(
        "messages",
        _messages(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                    ],
                }
            ]
        ),
        400,
        ("cannot be decoded",),
    ),
    Http(
        "messages",
        _messages(
            messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4"}]}]
        ),
        400,
        ("tool_use_id 't1' answers no tool_use block",),
    ),
    Http("messages", _messages(messages=[*TEXT, {"role": "assistant", "content": "The answer is"}]), 400, ("prefill",)),
    Http(
        "messages", _messages(tools=[{"type": "web_search_20250305", "name": "web_search"}]), 400, ("is a server tool",)
    ),
    Http("messages", _messages(tools=[{"name": "calc"}]), 400, ("tools[0].input_schema",)),
    Http("messages", _messages(tool_choice={"type": "any"}), 400, ("is not served", '{"type": "auto"}')),
    Http(
        "messages",
        _messages(tool_choice={"type": "auto", "disable_parallel_tool_use": True}),
        400,
        ("'disable_parallel_tool_use' is not served",),
    ),
    Http(
        "messages",
        _messages(tool_choice={"type": "auto", "disable_parallel_tool_us": False}),
        400,
        ("'tool_choice.disable_parallel_tool_us'", "did you mean 'tool_choice.disable_parallel_tool_use'"),
    ),
    Http(
        "messages",
        _messages(tool_choice={"type": "none", "disable_parallel_tool_use": False}),
        400,
        ("'tool_choice.disable_parallel_tool_use' is not a key of a tool_choice of type 'none'", "its keys: 'type'"),
    ),
    Http(
        "messages",
        _messages(tools=[{**MESSAGES_TOOL, "parameters": SCHEMA}]),
        400,
        ("'tools[0].parameters' is not a key of a Messages API custom tool", "'input_schema'"),
    ),
    Http(
        "messages", _messages(tools=[{**MESSAGES_TOOL, "defer_loading": True}]), 400, ("'defer_loading' is not served",)
    ),
    Http(
        "messages",
        _messages(tools=[{**MESSAGES_TOOL, "allowed_callers": ["code_execution_20250825"]}]),
        400,
        ("tools[0]: 'allowed_callers' ['code_execution_20250825'] is not served", '["direct"]'),
    ),
    Http(
        "messages",
        _messages(tools=[{**MESSAGES_TOOL, "input_examples": [{"expression": "1+1"}]}]),
        400,
        ("'input_examples' are not served",),
    ),
    Http(
        "messages",
        _messages(messages=[{"role": "user", "content": "Hi", "name": "ann"}]),
        400,
        ("'messages[0].name' is not a key of a Messages API message", "its keys: 'role', 'content'"),
    ),
    Http(
        "messages", _messages(stop_sequences=["Hello world"]), 400, ("stop_sequences entry 'Hello world' is 2 tokens",)
    ),
    Http("messages", _messages(stop_sequences="."), 400, ("'stop_sequences' must be a list of non-empty strings",)),
    Http("messages", _messages(mcp_servers=[{"url": "https://x"}]), 400, ("MCP servers are run by the client",)),
    Http(
        "messages",
        _messages(thinking={"type": "enabled", "budget_tokens": 1024}),
        400,
        ("'thinking.budget_tokens' must be an integer from 1 to max_tokens - 1",),
    ),
    Http("messages", _messages(thinking={"type": "disabled"}), 400, ("asks for no reasoning", "--template-kwargs")),
    Http(
        "messages",
        _messages(thinking={"type": "disabled", "budget_tokens": 0}),
        400,
        ("'thinking.budget_tokens' is not a key",),
    ),
    Http(
        "messages",
        _messages(thinking={"type": "enabled", "budget_tokens": 2, "display": "omitted"}),
        400,
        ("'thinking.display' 'omitted' is not served",),
    ),
    Http(
        "messages",
        _messages(thinking={"type": "between_tools"}),
        400,
        ("'thinking.type' 'between_tools' is not served",),
    ),
    Http("messages", _messages(thinking=True), 400, ("'thinking' must be an object",)),
    Http("messages", _messages(thinking={"type": ["enabled"]}), 400, ("'thinking.type' ['enabled'] is not served",)),
    # sessions and paths
    Http("end", None, 404, ("unknown session 'never-opened'", "nothing was ended"), session="never-opened"),
    Http(
        "end",
        None,
        200,
        ("session 'done' had ended already (ended by the client)", "nothing more was recorded"),
        session="done",
    ),
    Http("chat", _chat(), 409, ("session 'done' has ended", "open a new session"), session="done"),
    Http("messages", _messages(), 409, ("session 'done' has ended",), session="done"),
    Http("responses", _responses(), 409, ("session 'done' has ended",), session="done"),
    Http("models", None, 409, ("session 'done' has ended",), session="done", method="GET"),
    Http("open", None, 409, ("session 'done' has ended",), session="done"),
    Http("/sessions/s/v1/completions", _chat(), 404, ("no endpoint '/sessions/s/v1/completions'", "chat/completions")),
    Http(
        "/v1/chat/completions",
        _chat(),
        404,
        ("no endpoint '/v1/chat/completions'", "/sessions/{id}/v1/chat/completions"),
    ),
    Http("/sessions//v1/chat/completions", _chat(), 404, ("no endpoint",)),
    Http("chat", None, 405, ("GET is not served on",), method="GET"),
    Http("/sessions/s/v1/messages", None, 405, ("GET is not served on",), method="GET"),
]
