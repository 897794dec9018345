"""``verl-ext check-template`` names the reader that serves the template and proves the derived one on a render."""

from __future__ import annotations

import json
import re

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


def test_the_read_back_proof_shows_and_checks_the_content(tokenizer_dirs, capsys, tmp_path):
    """The proof shows the calls and the content read back (the template wrapped none) and its verdict; the ``--html``
    audit has the same tool-call reader section."""
    html = tmp_path / "audit.html"
    assert main(["check-template", str(tokenizer_dirs["mistral-7b-v0.3"]), "--html", str(html)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[6] == "  content:        ''"
    assert lines[7] == "  read-back:      the calls rendered, and the content the template wrapped"
    page = html.read_text(encoding="utf-8")
    section = page[page.index('<section id="tool-call-reader">') :]
    section = section[: section.index("</section>")]
    assert "derived form: <code>json object" in section and "reads back" in section
    assert "qxtoola({&#34;qxka&#34;: &#34;QXVA1&#34;})" in section or 'qxtoola({"qxka": "QXVA1"})' in section
    assert "content read back</th><td><code>&#39;&#39;</code>" in section


def test_a_reading_that_leaves_the_section_close_in_the_content_fails_the_audit(
    tokenizer_dirs, capsys, tmp_path, monkeypatch
):
    """The mutation: a reader that stops consuming a section at its last call (trail and close left in the content,
    Mistral's ``]``) is a reader failure: in the verdict, the proof's reason, the ``--html`` section and the exit
    code."""
    from verl_ext.core.bounded_cache import LruCache
    from verl_ext.core.call_reader import learn, read

    init = read.CallReader.__init__

    def leaves_the_close(self, form):
        init(self, form)
        self.trail = re.compile("")  # the section read up to its last call: its trail and close left in the content

    monkeypatch.setattr(read.CallReader, "__init__", leaves_the_close)
    monkeypatch.setattr(learn, "_CACHE", LruCache("derived call readers", 64))
    html = tmp_path / "audit.html"
    assert main(["check-template", str(tokenizer_dirs["mistral-7b-v0.3"]), "--html", str(html)]) == 1
    out = capsys.readouterr().out
    assert "verdict: repairable; the tool-call reader FAILS its read-back" in out.splitlines()[1]
    assert "leaves call-marker text in the content: ']'" in out
    assert "fails" in html.read_text(encoding="utf-8").split('id="tool-call-reader"')[1]
