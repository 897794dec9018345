"""The command line refuses what cannot be what the user meant, with the reason on one line and exit code 2: a
template kwarg the template never reads, a stop id outside the vocabulary, a tokenizer folder mixing two models'
files, a Git LFS pointer in place of a file, and an output path that cannot be written (refused before the slow
part, a folder named as such)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from verl_ext.cli.main import main

# A Git LFS pointer as a clone without `git lfs` holds it in place of the file.
LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4b0a1d47b0d2a1e8c2cbd5ed2e1a0c1bb5b4f6bb2c9d7a7f1d1f0e0a2b3c4d5e\n"
    "size 11422654\n"
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


def folder_copy(src: Path, tmp_path: Path, name: str = "tok") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("extra_templates", "SOURCE.md"))
    return dst


def test_template_kwargs_the_template_never_reads_are_refused(tokenizer_dirs, capsys):
    qwen3 = str(tokenizer_dirs["qwen3"])
    code, _, err = run(capsys, "check-template", qwen3, "--template-kwargs", '{"enable_thinkin": false}')
    assert_one_line(code, err, "never reads 'enable_thinkin'", "did you mean 'enable_thinking'")
    # a template that reads no kwarg at all (Mistral v0.3's) refuses Qwen3's switch
    code, _, err = run(
        capsys, "check-template", str(tokenizer_dirs["mistral-7b-v0.3"]), "--template-kwargs", '{"enable_thinking": 0}'
    )
    assert_one_line(code, err, "never reads 'enable_thinking'")
    # the kwarg the template reads is taken, and shown in the audit
    code, out, _ = run(capsys, "check-template", qwen3, "--template-kwargs", '{"enable_thinking": false}', "--json")
    assert code == 0 and json.loads(out)["template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize("stop", ["-5", "-1", "151669", "999999"])
def test_stop_ids_outside_the_vocabulary_are_refused(tokenizer_dirs, capsys, stop):
    code, _, err = run(capsys, "check-template", str(tokenizer_dirs["qwen3"]), "--stop", stop)
    assert_one_line(code, err, f"--stop {stop!r}", "0 to 151668")


def test_the_last_id_of_the_vocabulary_is_a_stop_id(tokenizer_dirs, capsys):
    code, out, _ = run(capsys, "check-template", str(tokenizer_dirs["qwen3"]), "--stop", "151668", "--json")
    assert code == 0
    assert 151668 in [s["id"] for s in json.loads(out)["stop_ids"]]


def test_an_eos_id_past_the_vocabulary_is_two_models_files(tokenizer_dirs, tmp_path, capsys):
    folder = folder_copy(tokenizer_dirs["mistral-7b-v0.3"], tmp_path)
    # Qwen3's generation_config.json next to Mistral's 32,768-token vocabulary
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    code, _, err = run(capsys, "check-template", str(folder))
    assert_one_line(code, err, "generation_config.json: eos_token_id 151645 is past the vocabulary", "different models")
    (folder / "generation_config.json").unlink()
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 151645}))
    code, _, err = run(capsys, "check-template", str(folder))
    assert_one_line(code, err, "config.json", "eos_token_id 151645", "different models")


def test_a_tokenizer_config_of_another_model_is_refused(tokenizer_dirs, tmp_path, capsys):
    folder = folder_copy(tokenizer_dirs["mistral-7b-v0.3"], tmp_path)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dirs["qwen3"] / name, folder / name)
    code, _, err = run(capsys, "check-template", str(folder))
    assert_one_line(code, err, "tokenizer_config.json", "which tokenizer.json does not have", "different models")


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"])
def test_a_git_lfs_pointer_is_named(tokenizer_dirs, tmp_path, capsys, name):
    folder = folder_copy(tokenizer_dirs["qwen3"], tmp_path)
    (folder / name).write_text(LFS_POINTER)
    code, _, err = run(capsys, "check-template", str(folder))
    assert_one_line(code, err, f"{name}: a Git LFS pointer", "11,422,654 bytes", "git lfs pull")


def test_a_git_lfs_pointer_as_chat_template_file_is_named(tokenizer_dirs, tmp_path, capsys):
    template = tmp_path / "template.jinja"
    template.write_text(LFS_POINTER)
    code, _, err = run(capsys, "check-template", str(tokenizer_dirs["qwen3"]), "--chat-template", str(template))
    assert_one_line(code, err, "template.jinja: a Git LFS pointer", "git lfs pull")


def test_output_paths_are_refused_before_the_slow_part(tokenizer_dirs, tmp_path, capsys):
    qwen3 = str(tokenizer_dirs["qwen3"])
    cases = [
        (["check-template", qwen3, "--html", str(tmp_path)], "is a folder", str(tmp_path / "audit.html")),
        (["check-template", qwen3, "--html", str(tmp_path / "no" / "a.html")], "does not exist", "create it"),
        (["report", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path)], "is a folder", "pass a file name"),
        (["report", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "no" / "r.html")], "does not exist", "-o"),
    ]
    (tmp_path / "plain").write_text("a file")
    cases.append((["report", "x.jsonl", "-o", str(tmp_path / "plain" / "r.html")], "is a file, not a folder", "-o"))
    cases.append((["demo", "--out", str(tmp_path / "plain")], "--out", "is a file, not a folder", "pass a folder"))
    if Path("/proc/self").is_dir():  # Linux: a folder whose permissions say writable (to root) that takes no file
        cases += [
            (["check-template", qwen3, "--html", "/proc/a.html"], "--html '/proc/a.html' cannot be written"),
            (["report", "x.jsonl", "-o", "/proc/r.html"], "-o '/proc/r.html' cannot be written"),
            (["demo", "--out", "/proc/demo"], "--out '/proc/demo' cannot be written"),
        ]
    if Path("/etc/passwd").is_file():
        cases.append((["demo", "--out", "/etc/passwd"], "--out '/etc/passwd' is a file, not a folder"))
    for argv, *words in cases:
        start = time.perf_counter()
        code, out, err = run(capsys, *argv)
        # no probe, no record read: the records named do not even exist, and nothing was printed
        assert_one_line(code, err, *words)
        assert out == "" and time.perf_counter() - start < 5, (argv, out)


def test_replay_reads_its_files_before_loading_the_tokenizer(tmp_path, capsys):
    # the tokenizer folder does not exist either: the file, checked first, is what the error names (no 5 s load)
    no_tokenizer = str(tmp_path / "no-tokenizer")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    for files, words in (
        ([str(tmp_path / "missing.jsonl")], ("missing.jsonl' does not exist",)),
        ([str(bad)], (f"{bad}:2: not valid JSON",)),
        ([str(bad), str(tmp_path / "missing.jsonl")], (f"{bad}:2: not valid JSON",)),
    ):
        code, out, err = run(capsys, "replay", *files, "--tokenizer", no_tokenizer)
        assert_one_line(code, err, *words)
        assert "no-tokenizer" not in err and out == ""


def test_an_unquoted_special_token_in_a_demo_override_names_the_quoted_fix(tmp_path, capsys):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = tmp_path / "demo"
    code, _, err = run(capsys, "demo", "--out", str(out), "verl_ext.extra_stop_tokens=[</tool_call>]")
    assert_one_line(code, err, "Hydra cannot read the override", "Quote each string")
    assert "LexerNoViableAltException" not in err and not out.exists()  # refused before the folder, the trainer
    fix = err.strip().split("for the shell: ", 1)[1]
    assert fix == """'verl_ext.extra_stop_tokens=["</tool_call>"]'"""
    (parsed,) = OverridesParser.create().parse_overrides([fix[1:-1]])
    assert parsed.value() == ["</tool_call>"]
