"""``verl-ext check-template`` names the reader that serves the template and proves the derived one on a render."""

from __future__ import annotations

import json

from verl_ext.cli.main import main


def test_a_template_no_verl_parser_reads_is_served_by_the_derived_reader(tokenizer_dirs, capsys):
    assert main(["check-template", str(tokenizer_dirs["mistral-7b-v0.3"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "the reader derived from the template reads them" in lines[2]
    assert "need one: register a parser" not in lines[2]  # the "no parser" verdict is gone where the reader works
    assert lines[3].startswith("tool-call reader: derived from the template (json object")
    assert lines[4].startswith("  rendered calls: '[TOOL_CALLS]")
    assert lines[5] == '  read back as:   qxtoola({"qxka": "QXVA1"}), qxtoolb({"qxkb": "QXVB2"})'


def test_a_template_verl_reads_names_verl_first(tokenizer_dirs, capsys):
    assert main(["check-template", str(tokenizer_dirs["qwen3"]), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["verl_tool_parsers"]
    assert fit["reader"].startswith("verl's hermes (multi_turn.format=hermes)")
    derived = fit["derived_reader"]
    assert derived["reads"] and derived["read_back"] == [["qxtoola", {"qxka": "QXVA1"}], ["qxtoolb", {"qxkb": "QXVB2"}]]


def test_a_template_without_readable_calls_says_why(tokenizer_dirs, templates_dir, capsys):
    phi = templates_dir / "phi-4-mini-instruct_ollama-gguf.jinja"
    main(["check-template", str(tokenizer_dirs["mistral-7b-v0.3"]), "--chat-template", str(phi), "--json"])
    data = json.loads(capsys.readouterr().out)
    fit = data.get("verl_tool_parsers")
    if fit is None:  # the template is refused outright: no reader advice at all
        assert data["verdict"] == "unsupported"
        return
    assert not fit["derived_reader"]["reads"]
    assert "renders nothing of a tool call" in fit["derived_reader"]["why_not"]
