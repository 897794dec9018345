"""The audit's words on the cases a new user met: Gemma 2's tool-call line reads as a sentence and its tool reason
has a fix, a folder whose config names a special token its tokenizer.json lacks is refused (not listed as a stop id
past the vocabulary), a template that needs a kwarg names the flag that passes it, and a Llama-style folder
(``clean_up_tokenization_spaces`` on a BPE tokenizer) audits without transformers' warning about that flag."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from verl_ext.cli.check_template import format_profile
from verl_ext.cli.main import main
from verl_ext.core.errors import TemplateError
from verl_ext.core.probe import probe_template
from verl_ext.core.template_profile import Severity

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from template_fixtures import template_path, template_renderer  # noqa: E402

FIREFUNCTION = "fireworks-ai-llama-3-firefunction-v2"


def test_gemma_2s_audit_reads_as_sentences_and_its_tool_reason_has_a_fix():
    r = template_renderer("google-gemma-2-2b-it")
    profile = probe_template(r)
    text = format_profile(r, profile, source="gemma-2", parsers=None)
    (line,) = [x for x in text.splitlines() if x.startswith("tool-call input:")]
    assert line.endswith("the template renders nothing of the call (it can only live in the content text)"), line
    assert "renders not rendered" not in text
    (tool,) = [x.text for x in profile.reasons if x.severity is Severity.UNSUPPORTED and "tool message" in x.text]
    assert "Cause: the template has no tool turn" in tool and "Fix: " in tool and "--chat-template FILE" in tool


def folder_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("extra_templates", "SOURCE.md"))
    return dst


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("mix", ["eos of another model", "another model's config without its added tokens"])
def test_a_special_token_tokenizer_json_lacks_is_refused_not_listed(mix, tokenizer_dirs, tmp_path, capsys):
    folder = folder_copy(tokenizer_dirs["mistral-7b-v0.3"], tmp_path / "mixed")
    config_file = folder / "tokenizer_config.json"
    if mix == "eos of another model":
        config = json.loads(config_file.read_text())
        config["eos_token"] = "<|im_end|>"  # Qwen's: Mistral's tokenizer.json has no such token
        named = "'<|im_end|>'"
    else:
        config = json.loads((tokenizer_dirs["qwen3"] / "tokenizer_config.json").read_text())
        config.pop("added_tokens_decoder")  # (with it, the id check already refuses the folder)
        named = "'<|im_start|>'"
    config_file.write_text(json.dumps(config))
    code, out, err = run(capsys, "check-template", str(folder))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"{config_file}: names the special token {named}, which tokenizer.json does not have" in err
    assert "past the model's vocabulary of 32,768 ids" in err and "copy both again" in err


def test_a_template_that_needs_a_kwarg_names_the_flag(tokenizer_dirs, capsys):
    with pytest.raises(TemplateError, match=r"'functions' is undefined; the template reads 'functions' from its"):
        probe_template(template_renderer(FIREFUNCTION).with_template_kwargs({}))
    code, _, err = run(
        capsys, "check-template", str(tokenizer_dirs["qwen3"]), "--chat-template", str(template_path(FIREFUNCTION))
    )
    assert code == 2 and err.count("\n") == 1, err
    assert "pass it as a template kwarg (verl-ext: --template-kwargs '{\"functions\": ...}'" in err
    assert "training: data.apply_chat_template_kwargs" in err


def test_a_llama_style_cleanup_flag_audits_without_transformers_warning(tokenizer_dirs, tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    plain = folder_copy(tokenizer_dirs["mistral-7b-v0.3"], tmp_path / "plain")
    flagged = folder_copy(plain, tmp_path / "flagged")
    config = json.loads((flagged / "tokenizer_config.json").read_text())
    config["clean_up_tokenization_spaces"] = True  # as Llama 3's folders have it (a BPE tokenizer: no effect)
    (flagged / "tokenizer_config.json").write_text(json.dumps(config))
    # transformers logs through its own handler (not propagated, bound to the stderr of its first use) and only
    # once per process: collect its records here, with the once-cache cleared
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    hf_logging.warning_once.cache_clear()
    logging.getLogger("transformers").addHandler(handler)
    outputs = []
    try:
        for folder in (plain, flagged):
            assert main(["check-template", str(folder)]) == 0
            outputs.append(capsys.readouterr().out.split("\n", 1)[1])  # the first line names folder and fingerprint
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [r.getMessage() for r in records if "clean_up_tokenization_spaces" in r.getMessage()]
    assert outputs[0] == outputs[1]  # the flag changes nothing but the warning
