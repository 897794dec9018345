"""The template audit says the truth: an "unsupported" verdict names the real cause and a fix (markers that are not
tokens of this tokenizer), a close the template writes only after several tool calls is named as the template's bug
and repaired, and a usable template's audit says which of verl's tool parsers (``multi_turn.format``) reads its tool
calls, derived from the calls the template writes: one tokenizer with two templates gets two parsers."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from verl_ext.cli.main import main
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import Severity
from verl_ext.plugin.tool_parser_fit import tool_parser_fit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from template_fixtures import BASES, _base_dir, markers, template_path, template_renderer, tokenizer_with  # noqa: E402

R1 = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"
HERMES = "multi_turn.format=hermes reads this template's tool calls"
CLOSE = "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}"


def unsupported_reasons(profile) -> list[str]:
    return [r.text for r in profile.reasons if r.severity is Severity.UNSUPPORTED]


def r1_with_close_in_the_loop() -> ChatRenderer:
    """DeepSeek R1's template as the model repository first shipped it: the turn's close written in the loop's branch
    for the second and later calls only, over a tokenizer that holds the tool markers as non-special added tokens
    (as DeepSeek's does) and bos/eos as special ones."""
    text = template_path(R1).read_text(encoding="utf-8")
    assert text.count(CLOSE) == 1
    text = text.replace("    " + CLOSE + "\n", "")
    later_call = "'```' + '<｜tool▁call▁end｜>'}}\n      {%- endif -%}"
    assert text.count(later_call) == 1
    text = text.replace(later_call, "'```' + '<｜tool▁call▁end｜>'}}" + CLOSE + "\n      {%- endif -%}")
    found = markers(text)
    base, bos, eos = BASES[R1]
    tok = tokenizer_with(_base_dir(base), [m for m in found if "tool" not in m], [m for m in found if "tool" in m])
    tok.add_special_tokens({"bos_token": bos, "eos_token": eos})
    return ChatRenderer(tok, chat_template=text)


def test_a_close_written_only_after_several_calls_is_named_with_the_fix():
    """The probe takes the close from the two-call render (``Boundary.close_omitted``): the template is repairable,
    and the audit names its bug and what a turn keeps instead of refusing tool messages."""
    profile = probe_template(r1_with_close_in_the_loop())
    assert profile.verdict.value == "repairable"
    assert not [r for r in unsupported_reasons(profile) if "tool message" in r]
    repairs = [r.text for r in profile.reasons if r.severity is Severity.REPAIR]
    (why,) = [r for r in repairs if r.startswith("writes no close after a single tool call")]
    assert "but <｜end▁of▁sentence｜> after several (a bug of the template)" in why, why
    assert "a turn keeps the close the engine samples" in why, why


def test_the_template_as_fixed_upstream_is_usable():
    """The same template with its close after the loop (the fixture as shipped) is not refused for tool messages."""
    profile = probe_template(template_renderer(R1))
    assert not [r for r in unsupported_reasons(profile) if "tool message" in r]


def test_markers_that_are_not_tokens_of_the_tokenizer_are_named(tokenizer_dirs, templates_dir, capsys):
    llama = templates_dir / "meta-llama-Llama-3.3-70B-Instruct.jinja"
    code = main(["check-template", str(tokenizer_dirs["qwen3"]), "--chat-template", str(llama), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["verdict"] == "unsupported"
    reasons = [r["text"] for r in data["reasons"] if r["severity"] == "unsupported"]
    assert reasons
    for reason in reasons:
        assert "Cause: the template's markers '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>'" in reason
        assert "are not tokens of this tokenizer" in reason and "Fix: audit the template with" in reason
    assert "verl_tool_parsers" not in data  # an unsupported template gets no parser advice


def test_a_usable_template_names_the_verl_tool_parser_that_reads_its_calls(tokenizer_dirs, tmp_path, capsys):
    qwen3 = str(tokenizer_dirs["qwen3"])
    audit = tmp_path / "audit.html"
    assert main(["check-template", qwen3, "--html", str(audit)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == ["verdict: repairable", f"verl tool parser: {HERMES}"]
    page = audit.read_text(encoding="utf-8")
    assert "verl tool parser (multi_turn.format)" in page and "multi_turn.format=hermes" in page
    # one tokenizer, another template: Qwen3-Coder writes XML calls, which verl's qwen3_coder parser reads
    coder = tokenizer_dirs["qwen3"] / "extra_templates" / "qwen3-coder-30b-a3b-instruct_ollama-gguf.jinja"
    assert main(["check-template", qwen3, "--chat-template", str(coder), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["verl_tool_parsers"]
    assert fit["readers"] == ["qwen3_coder"] and fit["verl_version"] == "0.9.1"
    # a format no parser of verl reads is said to be so, with the parsers tried
    assert main(["check-template", str(tokenizer_dirs["mistral-7b-v0.3"])]) == 0
    out = capsys.readouterr().out
    assert re.search(r"verl tool parser: none of verl 0\.9\.1's tool parsers \(.*hermes.*\) reads", out), out


@pytest.mark.parametrize(
    ("name", "parser"),
    [("moonshotai-Kimi-K2", "kimi"), ("ByteDance-Seed-OSS", "seed"), ("meta-llama-Llama-3.3-70B-Instruct", None)],
)
def test_the_parser_follows_the_calls_the_template_writes(name, parser):
    renderer = template_renderer(name)
    fit = tool_parser_fit(renderer, probe_template(renderer))
    assert fit.readers == ((parser,) if parser else ()), fit.summary()
    assert "hermes" in fit.tried and len(fit.tried) >= 9
