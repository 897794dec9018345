"""What the reader learns from each template, and the literal patterns it reads with.

Every template case is classified (``call_reader_cases``): a template that renders calls gets a reader of the
encoding it writes, proved on its own render of two calls (or one, where it renders one); one that renders no
readable call gets None and the reason, never a guess.
"""

from __future__ import annotations

import re

import pytest
from call_reader_cases import LEARNED, NOT_LEARNED, case_renderer

from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.call_reader.literals import COUNTER, chunks, counted, spaced
from verl_ext.core.probe import probe_template


@pytest.mark.parametrize("case", sorted(LEARNED))
def test_a_template_that_renders_calls_gets_a_reader(case):
    r = case_renderer(case)
    learned = learn_call_reader(r, probe_template(r))
    assert learned.reader is not None, learned.why
    assert learned.reader.form.encoding == LEARNED[case]
    assert learned.proof[0] == ("qxtoola", {"qxka": "QXVA1"})
    assert learned.proof[1:] in ((), (("qxtoolb", {"qxkb": "QXVB2"}),))
    assert "qxtoola" in learned.example


@pytest.mark.parametrize("case", sorted(NOT_LEARNED))
def test_a_template_without_readable_calls_gets_none_and_why(case):
    r = case_renderer(case)
    learned = learn_call_reader(r, probe_template(r))
    assert learned.reader is None
    assert NOT_LEARNED[case] in learned.why


def test_literals_are_chunks_read_with_any_spacing():
    assert chunks("\n<tool_call>\n") == ["<tool_call>"]
    assert chunks("<|channel|>commentary json<|message|>") == ["<|channel|>", "commentary", "json", "<|message|>"]
    pattern = re.compile(spaced("<|end|><|start|>assistant"))
    assert pattern.fullmatch("<|end|> <|start|>\nassistant")
    assert not pattern.fullmatch("<|end|>assistant")


def test_a_number_that_counts_the_calls_is_learned_as_a_counter():
    assert (
        counted([":0<|tool_call_argument_begin|>", ":1<|tool_call_argument_begin|>"])
        == f":{COUNTER}<|tool_call_argument_begin|>"
    )
    assert counted(["a", "b"]) is None  # differs in more than a number: nothing is learned
