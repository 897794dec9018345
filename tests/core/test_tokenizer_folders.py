"""Mutated tokenizer folders and template files through the real CLI (``check-template``, ``replay``, ``report``):
each gives the unmutated folder's result or a clear error (exit code 2, one line naming the file, no traceback).

A folder starts as the shipped Qwen3 tokenizer, in one of two real layouts: as published (the template in
tokenizer_config.json) and as transformers 5 saves it (chat_template.jinja, with a generation_config.json). One file
is then damaged: truncated, emptied, made non-UTF-8, replaced by random bytes, a folder, a symlink loop or a dangling
link, removed, given a key of the wrong JSON type, or (tokenizer.json) given an added token with a bad id.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from verl_ext.cli.main import main

RECORD = {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]}
QWEN3_VOCAB = 151669

# Values of the wrong JSON type for each key a loader reads (none of them can be valid for its key).
NOT_A_STRING = st.one_of(st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=False), st.just([1, 2]))
NOT_A_TOKEN = st.one_of(
    st.booleans(), st.integers(-3, 10**6), st.lists(st.integers(0, 9), max_size=3), st.just({"id": 5})
)
NOT_A_BOOL = st.one_of(st.integers(0, 1), st.sampled_from(["yes", "false", "1"]), st.just([True]))
NOT_AN_ID = st.one_of(
    st.integers(-(2**40), -1), st.integers(2**32, 2**40), st.floats(allow_nan=False), st.sampled_from(["7", True])
)
WRONG_TYPES: dict[tuple[str, str], st.SearchStrategy[Any]] = {
    ("tokenizer_config.json", "chat_template"): st.one_of(
        NOT_A_STRING, st.just([{"name": "default"}]), st.just({"template": "x"})
    ),
    ("tokenizer_config.json", "eos_token"): NOT_A_TOKEN,
    ("tokenizer_config.json", "pad_token"): NOT_A_TOKEN,
    ("tokenizer_config.json", "additional_special_tokens"): st.one_of(
        st.just("<|im_end|>"), st.lists(NOT_A_TOKEN, min_size=1, max_size=2), st.integers()
    ),
    ("tokenizer_config.json", "added_tokens_decoder"): st.one_of(
        st.just([1]),
        st.just({"abc": {"content": "<x>"}}),
        st.just({"-1": {"content": "<x>"}}),
        st.just({"151643": {"content": 5}}),
        st.just({"151643": "<|endoftext|>"}),
    ),
    ("tokenizer_config.json", "clean_up_tokenization_spaces"): NOT_A_BOOL,
    ("tokenizer_config.json", "split_special_tokens"): NOT_A_BOOL,
    ("tokenizer_config.json", "tokenizer_class"): st.one_of(st.integers(), st.just(["Qwen2Tokenizer"])),
    ("tokenizer_config.json", "model_max_length"): st.one_of(st.just("131072"), st.integers(-100, -1), st.just([1])),
    ("special_tokens_map.json", "eos_token"): NOT_A_TOKEN,
    ("special_tokens_map.json", "additional_special_tokens"): st.one_of(
        st.just("<|im_end|>"), st.lists(NOT_A_TOKEN, min_size=1, max_size=2)
    ),
    ("generation_config.json", "eos_token_id"): st.one_of(NOT_AN_ID, st.just([]), st.lists(NOT_AN_ID, min_size=1)),
    ("generation_config.json", "pad_token_id"): NOT_AN_ID,
}


def file_hash(folder: Path) -> str:
    """The folder's contents (names, kinds and bytes): the tokenizer cache key."""
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        h.update(f.name.encode())
        if f.is_file() and not f.is_symlink():
            h.update(hashlib.sha256(f.read_bytes()).digest())
        else:
            h.update(b"link" if f.is_symlink() else b"other")
    return h.hexdigest()


@pytest.fixture(scope="module")
def bases(tokenizer_dirs, tmp_path_factory) -> dict[str, Path]:
    """The two real layouts of the Qwen3 folder."""
    shipped = tokenizer_dirs["qwen3"]
    published = tmp_path_factory.mktemp("published")
    saved = tmp_path_factory.mktemp("saved")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        for folder in (published, saved):
            os.link(shipped / name, folder / name)
    config = json.loads((shipped / "tokenizer_config.json").read_text())
    (saved / "chat_template.jinja").write_text(config.pop("chat_template"))
    (saved / "tokenizer_config.json").unlink()  # a hard link: never written through
    (saved / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    # Qwen3's own generation_config.json
    (saved / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643})
    )
    return {"published": published, "saved": saved}


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def cached_loads(monkeypatch_module) -> None:
    """transformers' load, once per distinct folder content (loading is the cost, not the point). A load that
    raises is not cached: the same damage raises again."""
    from transformers import AutoTokenizer

    cache: dict[str, Any] = {}
    real = AutoTokenizer.from_pretrained

    def cached_from_pretrained(path: str, **kw: Any) -> Any:
        key = file_hash(Path(path))
        if key not in cache:
            cache[key] = real(path, **kw)
        loaded = copy.copy(cache[key])  # as if loaded from this folder: errors and the probe name it
        loaded.name_or_path = str(path)
        return loaded

    monkeypatch_module.setattr(AutoTokenizer, "from_pretrained", cached_from_pretrained)


@pytest.fixture(scope="module")
def record_file(tmp_path_factory) -> Path:
    file = tmp_path_factory.mktemp("record") / "r.jsonl"
    file.write_text(json.dumps(RECORD) + "\n")
    return file


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_clear_error(code: int, err: str, command: str, names: str) -> None:
    """Exit code 2 and one line ``verl-ext COMMAND: error: ...`` that names ``names`` (the file or folder)."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"verl-ext {command}: error: "), err
    assert "Traceback" not in err
    assert names in lines[0], f"the error does not name {names!r}: {lines[0]}"


def run_quiet(*args: str) -> tuple[int, str, str]:
    """``run`` for module fixtures, which have no capsys."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def expected(bases, cached_loads, record_file) -> dict[str, Any]:
    """The unmutated folders' replay ids and check-template verdicts."""
    out: dict[str, Any] = {}
    for layout, folder in bases.items():
        code, text, err = run_quiet("replay", str(record_file), "--tokenizer", str(folder), "--json")
        assert code == 0, err
        code, verdict, err = run_quiet("check-template", str(folder), "--json")
        assert code == 0, err
        out[layout] = (json.loads(text)[0]["input_ids"], json.loads(verdict)["verdict"])
    assert out["published"] == out["saved"]  # the two layouts are one tokenizer
    return out


# -- mutations ---------------------------------------------------------------------------------------------------
# Each returns (the text the error must name, whether the folder must be refused).
Mutation = Callable[[Path], tuple[str, bool]]


def replace(file: Path, data: bytes) -> None:
    """Write ``data`` as ``file``, never through a hard link to the shipped folder."""
    if file.is_symlink() or file.exists():
        file.unlink()
    file.write_bytes(data)


KINDS = ("truncate", "empty", "not utf-8", "bytes", "folder", "loop", "dangling", "remove", "wrong type", "added")


@st.composite
def mutations(draw, layout: str, kind: str) -> tuple[str, Mutation]:
    files = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    if layout == "saved":
        files += ["chat_template.jinja", "generation_config.json"]
    if kind == "wrong type":
        choices = [k for k in WRONG_TYPES if k[0] in files]
        name, key = draw(st.sampled_from(choices))
        value = draw(WRONG_TYPES[(name, key)])

        def wrong_type(folder: Path) -> tuple[str, bool]:
            config = json.loads((folder / name).read_text())
            config[key] = value
            replace(folder / name, json.dumps(config).encode())
            return name, True

        return f"{name}: {key} = {value!r}", wrong_type
    if kind == "added":
        k = draw(st.integers(0, 25))
        field, value = draw(
            st.one_of(
                st.tuples(st.just("id"), NOT_AN_ID),
                st.tuples(st.just("id"), st.sampled_from([151643, 151645, 151665])),  # another token's id
                st.tuples(st.just("content"), st.one_of(st.integers(), st.none(), st.just("<|im_end|>"))),
            )
        )

        def bad_added_token(folder: Path) -> tuple[str, bool]:
            text = (folder / "tokenizer.json").read_text()
            start = text.index("[", text.index('"added_tokens"'))
            added, end = json.JSONDecoder().raw_decode(text, start)
            if added[k][field] == value:
                return "tokenizer.json", False  # no change: a valid folder
            added[k][field] = value
            replace(folder / "tokenizer.json", (text[:start] + json.dumps(added) + text[end:]).encode())
            return "tokenizer.json", True

        return f"tokenizer.json: added_tokens[{k}].{field} = {value!r}", bad_added_token
    name = draw(st.sampled_from(files))
    cut = draw(st.floats(0, 1))
    data = draw(st.binary(min_size=1, max_size=64))
    at = draw(st.floats(0, 1))

    def damage(folder: Path) -> tuple[str, bool]:
        file = folder / name
        original = file.read_bytes()
        if kind == "truncate":
            kept = original[: int(len(original) * cut)]
            replace(file, kept)
            # a cut that keeps the whole text (or, for the template, what still parses) may be accepted
            return name, kept.strip() != original.strip() and name != "chat_template.jinja"
        if kind == "empty":
            replace(file, b"")
        elif kind == "not utf-8":
            i = int(len(original) * at)
            replace(file, original[:i] + b"\xff\xfe" + original[i:])
        elif kind == "bytes":
            replace(file, data)
            return name, False  # random bytes may be valid (an empty JSON object of special tokens)
        elif kind == "folder":
            file.unlink()
            file.mkdir()
        elif kind == "loop":
            file.unlink()
            file.symlink_to(file.name)
        elif kind == "dangling":
            file.unlink()
            file.symlink_to("missing-" + file.name)
        else:  # remove: the file may be optional
            file.unlink()
            if name == "tokenizer.json":
                return name, True
            return str(folder), name == "chat_template.jinja"  # the saved layout's only template
        return name, True

    return f"{name}: {kind}", damage


def mutated_folder(base: Path, tmp: Path, mutation: Mutation) -> tuple[Path, str, bool]:
    folder = tmp / "tok"
    folder.mkdir(parents=True)
    for f in base.iterdir():
        os.link(f, folder / f.name)  # every file the mutation writes is unlinked first
    names, refuse = mutation(folder)
    return folder, names, refuse


# Each kind of damage gets its examples (hypothesis alone drew no wrong-type key in 25): 3 x 10 folders, most
# refused before transformers loads anything.
SETTINGS = settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(data=st.data())
def test_a_mutated_folder_gives_the_same_tokens_or_one_clear_line(
    bases, expected, record_file, capsys, tmp_path_factory, kind, data
):
    layout = data.draw(st.sampled_from(sorted(bases)), label="layout")
    description, mutation = data.draw(mutations(layout, kind), label="mutation")
    event(description.split(" = ")[0].split("[")[0])  # which file and damage: --hypothesis-show-statistics
    folder, names, refuse = mutated_folder(bases[layout], tmp_path_factory.mktemp("m"), mutation)
    ids, verdict = expected[layout]

    code, out, err = run(capsys, "replay", str(record_file), "--tokenizer", str(folder), "--json")
    if code == 2:
        assert_clear_error(code, err, "replay", names)
    else:
        assert not refuse, f"{description}: silently accepted: {out[:300]}"
        assert code == 0, err
        result = json.loads(out)[0]
        if "chat_template.jinja" not in description:
            assert result["input_ids"] == ids, description  # a damaged file never changes the tokens silently
        assert all(0 <= i < QWEN3_VOCAB for i in result["input_ids"])

    code, out, err = run(capsys, "check-template", str(folder), "--json")
    if code == 2:
        assert_clear_error(code, err, "check-template", names)
    else:
        assert not refuse, f"{description}: silently accepted"
        if "chat_template.jinja" not in description:
            assert json.loads(out)["verdict"] == verdict


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cut=st.integers(0, 4000), junk=st.sampled_from(["", "{%", "{{", "}}", "{% endif %}", "{% for %}", "\x00"]))
def test_a_cut_or_spliced_template_file_gives_a_result_or_one_clear_line(
    bases, expected, record_file, capsys, tmp_path_factory, cut, junk
):
    """``--chat-template FILE``: the real Qwen3 template cut short, with Jinja junk spliced in."""
    template = (bases["saved"] / "chat_template.jinja").read_text()
    file = tmp_path_factory.mktemp("t") / "t.jinja"
    file.write_text(template[:cut] + junk + template[cut:] if cut % 2 else template[:cut] + junk)
    for command in (
        ["replay", str(record_file), "--tokenizer", str(bases["published"]), "--chat-template", str(file), "--json"],
        ["check-template", str(bases["published"]), "--chat-template", str(file), "--json"],
    ):
        code, out, err = run(capsys, *command)
        if code == 2:
            assert_clear_error(code, err, command[0], str(file))
        else:
            assert code in (0, 1) and json.loads(out), err


def test_report_names_a_damaged_tokenizer_folder(bases, expected, record_file, tmp_path, capsys):
    """``report --tokenizer DIR`` loads the folder the same way: a damaged file is one line naming it."""
    from verl_ext.check import ConsistencyChecker, Rollout
    from verl_ext.check.inputs import engine_calls_from_trajectory, trainer_sample_from_trajectory
    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import load_renderer
    from verl_ext.core.replay import ReplayRecord, replay
    from verl_ext.telemetry.records import RecordWriter, header_record

    renderer = load_renderer(bases["published"])
    t = replay(renderer, ReplayRecord.from_json(RECORD))
    calls = engine_calls_from_trajectory(t)
    sample = trainer_sample_from_trajectory(t)
    rollout = Rollout.of(calls, sample, t.messages, kinds=[k.value for k in t.kinds])
    writer = RecordWriter(tmp_path / "records", header_record(probe_template(renderer)))
    writer.write(rollout.record(ConsistencyChecker(renderer).check_rollout(rollout)))

    def cut_tokenizer_json(folder: Path) -> tuple[str, bool]:
        replace(folder / "tokenizer.json", (bases["published"] / "tokenizer.json").read_bytes()[:5000])
        return "tokenizer.json", True

    folder, _, _ = mutated_folder(bases["published"], tmp_path, cut_tokenizer_json)
    html = tmp_path / "r.html"
    code, _, err = run(capsys, "report", str(writer.path), "-o", str(html), "--tokenizer", str(bases["published"]))
    assert code == 0, err  # the records are fine ...
    code, _, err = run(capsys, "report", str(writer.path), "-o", str(html), "--tokenizer", str(folder))
    assert_clear_error(code, err, "report", str(folder / "tokenizer.json"))  # ... the folder is not


def set_key(name: str, key: str, value: Any) -> Mutation:
    def mutate(folder: Path) -> tuple[str, bool]:
        config = json.loads((folder / name).read_text())
        config[key] = value
        replace(folder / name, json.dumps(config).encode())
        return name, True

    return mutate


def make_folder(name: str) -> Mutation:
    def mutate(folder: Path) -> tuple[str, bool]:
        (folder / name).unlink()
        (folder / name).mkdir()
        return name, True

    return mutate


def duplicate_added_token(folder: Path) -> tuple[str, bool]:
    text = (folder / "tokenizer.json").read_text()
    start = text.index("[", text.index('"added_tokens"'))
    added, end = json.JSONDecoder().raw_decode(text, start)
    added.append({**added[-1], "id": 151645, "content": "<extra>"})  # <|im_end|>'s id again
    replace(folder / "tokenizer.json", (text[:start] + json.dumps(added) + text[end:]).encode())
    return "tokenizer.json", True


# What the property test and a manual sweep found before the fix: a traceback (chat_template a number), silent
# acceptance (transformers 5 ignores special_tokens_map.json and tokenizer.json's added tokens, and falls back to
# tokenizer_config.json's template when chat_template.jinja is a folder; an engine loading the folder otherwise
# would see other tokens), and errors that named no file (generation_config.json read by the probe).
FOUND = {
    "chat_template is a number": ("published", set_key("tokenizer_config.json", "chat_template", 5)),
    "eos_token is a list of ids": ("published", set_key("tokenizer_config.json", "eos_token", [151645])),
    "special_tokens_map eos_token is an id": ("published", set_key("special_tokens_map.json", "eos_token", 5)),
    "added token with <|im_end|>'s id": ("published", duplicate_added_token),
    "chat_template.jinja is a folder": ("saved", make_folder("chat_template.jinja")),
    "generation_config eos_token_id is a string": ("saved", set_key("generation_config.json", "eos_token_id", "x")),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_each_case_found_is_refused_naming_the_file(bases, record_file, capsys, tmp_path, case):
    layout, mutation = FOUND[case]
    folder, names, _ = mutated_folder(bases[layout], tmp_path, mutation)
    code, _, err = run(capsys, "replay", str(record_file), "--tokenizer", str(folder), "--json")
    assert_clear_error(code, err, "replay", str(folder / names))


def named_templates(names: list[str]) -> Mutation:
    """tokenizer_config.json's 'chat_template' as a list of named templates, each the real Qwen3 template."""

    def mutate(folder: Path) -> tuple[str, bool]:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["chat_template"] = [{"name": name, "template": config["chat_template"]} for name in names]
        replace(folder / "tokenizer_config.json", json.dumps(config).encode())
        return "tokenizer_config.json", names != ["default"]

    return mutate


def test_named_templates_are_used_when_only_default_and_refused_when_transformers_would_choose(
    bases, expected, record_file, capsys, tmp_path
):
    """Named templates used to crash the renderer (a dict where a string belongs). Only 'default' is the one
    template; with 'tool_use' beside it transformers picks per call, which one rollout render cannot follow."""
    folder, _, _ = mutated_folder(bases["published"], tmp_path / "default", named_templates(["default"]))
    code, out, err = run(capsys, "replay", str(record_file), "--tokenizer", str(folder), "--json")
    assert code == 0, err
    assert json.loads(out)[0]["input_ids"] == expected["published"][0]
    folder, _, _ = mutated_folder(bases["published"], tmp_path / "two", named_templates(["default", "tool_use"]))
    code, _, err = run(capsys, "check-template", str(folder), "--json")
    assert_clear_error(code, err, "check-template", "has named chat templates ['default', 'tool_use']")
    assert "--chat-template FILE" in err


def test_a_symlink_loop_for_the_folder_or_the_template_file_is_named(bases, record_file, capsys, tmp_path):
    (tmp_path / "tok").symlink_to("tok")
    (tmp_path / "t.jinja").symlink_to("t.jinja")
    code, _, err = run(capsys, "replay", str(record_file), "--tokenizer", str(tmp_path / "tok"))
    assert_clear_error(code, err, "replay", f"{tmp_path / 'tok'}: a symlink loop")
    code, _, err = run(capsys, "check-template", str(bases["published"]), "--chat-template", str(tmp_path / "t.jinja"))
    assert_clear_error(code, err, "check-template", f"{tmp_path / 't.jinja'}: a symlink loop")


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_every_reader_names_the_bad_byte_counted_in_the_file_and_refuses_an_empty_file(tmp_path, bom):
    """The template file, a folder's chat_template.jinja, a JSON file and a load failure's trace all decode through
    one reader: the same message, with the byte counted from the file's start (a BOM used to be skipped)."""
    from verl_ext.core.errors import TemplateError
    from verl_ext.core.tokenizer_files import explain_load_failure, json_file_problem, read_template_file

    data = bom + b'{"a": "\xff"}'
    byte = len(bom) + 8  # 1-based position of \xff in the file
    template, config = tmp_path / "t.jinja", tmp_path / "tokenizer_config.json"
    template.write_bytes(data)
    config.write_bytes(data)
    with pytest.raises(TemplateError) as raised:
        read_template_file(template)
    assert str(raised.value) == f"{template}: not UTF-8 (byte {byte}); save the chat template as UTF-8"
    assert str(explain_load_failure(tmp_path, OSError("x"))).startswith(f"{config}: not UTF-8 (byte {byte}); ")
    config.unlink()
    assert str(explain_load_failure(tmp_path, OSError("x"))) == str(raised.value)
    assert json_file_problem(config) is None  # absent: nothing to blame
    config.write_bytes(bom + b" \n")
    assert json_file_problem(config) == f"{config}: the file is empty; " + (
        "the file is damaged: copy it again from the model's repository (or save_pretrained the tokenizer)"
    )
    template.write_bytes(bom + b"\n")
    with pytest.raises(TemplateError, match="the chat template file is empty; pass a Jinja chat template$"):
        read_template_file(template)
    template.write_bytes(bom + b"{{ messages[0].content }}")
    assert read_template_file(template) == "{{ messages[0].content }}"  # the BOM is not part of the template
