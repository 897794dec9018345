"""The command line: verdicts, JSON shapes and errors that name the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_ext.cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "replay" / "qwen3_tool_call.jsonl"


@pytest.mark.parametrize("family", ["qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3"])
def test_check_template_json(tokenizer_dirs, capsys, family):
    assert main(["check-template", str(tokenizer_dirs[family]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "repairable"
    assert data["boundaries"] and data["stop_ids"]


def test_check_template_words_and_extra_templates(tokenizer_dirs, qwen3_extra_templates, capsys):
    assert main(["check-template", str(tokenizer_dirs["qwen3"]), "--stop", "</tool_call>"]) == 0
    out = capsys.readouterr().out
    assert "verdict: repairable" in out and "'\\n'" in out and "</tool_call>" in out
    for template in qwen3_extra_templates:
        code = main(["check-template", str(tokenizer_dirs["qwen3"]), "--chat-template", str(template), "--json"])
        verdict = json.loads(capsys.readouterr().out)["verdict"]
        assert (verdict, code) == ("repairable", 0), template.name  # each extra template's verdict, pinned


def test_replay_json(tokenizer_dirs, capsys):
    assert main(["replay", str(EXAMPLE), "--tokenizer", str(tokenizer_dirs["qwen3"]), "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == 2
    for rec in records:
        assert len(rec["input_ids"]) == len(rec["loss_mask"]) == len(rec["logprobs"])
        assert rec["ok"] is True and rec["repairs"]
    assert [r["kind"] for r in records[1]["repairs"]] == ["boundary", "escaped_special", "escaped_special"]


def test_replay_text_and_bad_input(tokenizer_dirs, tmp_path, capsys):
    assert main(["replay", str(EXAMPLE), "--tokenizer", str(tokenizer_dirs["qwen3"]), "--tokens"]) == 0
    assert "invariants: all hold" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}], "sampled": {"0": [1]}}\n')
    assert main(["replay", str(bad), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 2
    assert "does not point at an assistant message" in capsys.readouterr().err
    bad.write_text("not json\n")
    assert main(["replay", str(bad), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 2
    assert "bad.jsonl:1: not valid JSON" in capsys.readouterr().err
    assert main(["check-template", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_docs_example_replays_as_documented(tokenizer_dirs, tmp_path, capsys):
    doc = (REPO / "docs" / "replay-format.md").read_text()
    block = doc[doc.index("```json") + len("```json") : doc.index("```", doc.index("```json") + 7)]
    record = tmp_path / "doc.jsonl"
    record.write_text(json.dumps(json.loads(block)) + "\n")
    assert main(["replay", str(record), "--tokenizer", str(tokenizer_dirs["qwen3"]), "--json"]) == 0
    (rec,) = json.loads(capsys.readouterr().out)
    assert [(r["kind"], r["text"]) for r in rec["repairs"]] == [("boundary", "\n"), ("synthetic_close", "<|im_end|>")]
    assert rec["input_ids"][-2:] == [151643, 151645] and rec["loss_mask"][-2:] == [1, 0]


def test_version(capsys):
    from verl_ext import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"verl-ext {__version__}"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_help_does_not_import_transformers_or_torch():
    # `verl-ext --help` took 7 s (24 s on a loaded 2-core box) importing the token core; it needs none of it
    out = _python(
        "import sys\nfrom verl_ext.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('transformers', 'torch', 'verl', 'tokenizers') if m in sys.modules))"
    )
    assert out.returncode == 0, out.stderr
    assert "check-template" in out.stdout and out.stdout.strip().splitlines()[-1] == "[]"


def test_a_closed_pipe_ends_quietly(tokenizer_dirs):
    # `verl-ext replay ... --tokens | head`: the reader is gone before the first line is written
    qwen3 = str(tokenizer_dirs["qwen3"])
    cmd = [sys.executable, "-m", "verl_ext.cli.main", "replay", str(EXAMPLE), "--tokenizer", qwen3, "--tokens"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141  # 128 + SIGPIPE, as a shell tool killed by the closed pipe
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
