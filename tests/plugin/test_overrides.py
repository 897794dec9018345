"""An override Hydra's grammar cannot read for want of quotes (a special token in a list of stop tokens) is explained
with the quoted fix: over every special token of the fixture tokenizers, alone and in lists, each override Hydra
refuses gets a fix that, pasted into bash, is one word Hydra parses to exactly the strings typed; an override Hydra
reads, or one quoting cannot fix, keeps Hydra's own answer."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_ext.plugin.overrides import check_overrides, explain, quoted_fix

KEY = "verl_ext.extra_stop_tokens"


def _special_tokens() -> list[str]:
    """The added tokens of every fixture tokenizer (read from its tokenizer.json), the special-token texts the fixture
    chat templates write (``<|eot_id|>``, ``<｜Assistant｜>``, ``<start_of_turn>``, ...), and a few plain words Hydra
    reads unquoted."""
    repo = Path(__file__).resolve().parents[2]
    tokens = {"stop", "END", "done_1"}
    for path in sorted((repo / "build" / "tokenizers").glob("*/tokenizer.json")):
        tokens |= {t["content"] for t in json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])}
    for path in sorted((repo / "tests" / "fixtures" / "templates").glob("*.jinja")):
        tokens |= set(re.findall(r"</?[|｜]?[A-Za-z_▁｜][^<>\s{}'\"%]{0,30}[|｜]?>", path.read_text(encoding="utf-8")))
    # a comma would split the list, a leading [ nest it: values no one would type unquoted
    return sorted(t for t in tokens if t.strip() == t and t and "," not in t and not t.startswith("["))


TOKENS = _special_tokens()


def parsed(override: str) -> object:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (one,) = OverridesParser.create().parse_overrides([override])
    return one.value()


def pasted(word: str, folder: Path) -> list[str]:
    """The words bash passes a command when ``word`` is pasted after it (in ``folder``: an unquoted ``>`` would make
    a file there)."""
    done = subprocess.run(["bash", "-c", f"printf '%s\\n' {word}"], cwd=folder, capture_output=True, text=True)
    assert done.returncode == 0 and not done.stderr and not list(folder.iterdir()), (word, done.stderr)
    return done.stdout.splitlines()


def test_the_fixture_tokenizers_hold_tokens_hydra_refuses_unquoted() -> None:
    refused = [t for t in TOKENS if explain(f"{KEY}=[{t}]") is not None]
    assert len(TOKENS) > 100 and len(refused) > 100, (len(TOKENS), len(refused))
    assert "</tool_call>" in refused and "<|im_end|>" in refused


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=3), st.booleans())
def test_every_refused_override_gets_a_fix_that_parses_to_what_was_typed(tokens: list[str], spaced: bool) -> None:
    import tempfile

    override = f"{KEY}=[{(', ' if spaced else ',').join(tokens)}]"
    message = explain(override)
    try:
        value = parsed(override)
    except Exception:
        assert message is not None, override  # Hydra refuses it: the message is ours, with a fix
        fix = message.split("for the shell: ", 1)[1]
        with tempfile.TemporaryDirectory() as folder:
            (word,) = pasted(fix, Path(folder))  # one shell word, as typed: no redirection, no glob
        assert parsed(word) == tokens, (override, word)
        with pytest.raises(Exception, match="Quote each string"):
            check_overrides(["+verl_ext=warn", override])
    else:
        assert message is None, (override, value)  # Hydra reads it: nothing to explain


def test_overrides_hydra_reads_or_quoting_cannot_fix_are_left_to_hydra() -> None:
    for override in ["+verl_ext=warn", f'{KEY}=["</tool_call>"]', "trainer.total_epochs=2", "a=[x y]"]:
        assert explain(override) is None, override
    assert quoted_fix("no equals sign <|im_end|>") is None
    check_overrides(["+verl_ext=warn", "verl_ext.check.allowed_causes=[bpe_remerge,eos_alias]"])


def test_the_verl_ext_options_of_overrides_are_read_as_hydra_reads_them() -> None:
    """``verl-ext demo`` checks the ``verl_ext.*`` options its overrides set before the trainer starts (the bad ones
    are in tests/bad_inputs.py); good ones pass, a preset selection (``+verl_ext=strict``) and other keys are left to
    Hydra."""
    from verl_ext.plugin.overrides import check_verl_ext_overrides, verl_ext_section

    overrides = ["+verl_ext=gateway", "verl_ext.check.mode=strict", "+verl_ext.records.dir=/tmp/r", "trainer.x=1"]
    overrides.append("""verl_ext.extra_stop_tokens=["</tool_call>"]""")
    assert verl_ext_section(overrides) == {
        "check": {"mode": "strict"},
        "records": {"dir": "/tmp/r"},
        "extra_stop_tokens": ["</tool_call>"],
    }
    check_verl_ext_overrides(overrides)  # nothing refused
