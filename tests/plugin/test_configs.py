"""verl_ext's Hydra config group composed with verl's real ppo_trainer config, and the driver-side preflight."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_harness import REPO, verl_config
from omegaconf import OmegaConf

from verl_ext.check.policy import CheckMode
from verl_ext.configs import CONFIG_DIR, PRESETS
from verl_ext.plugin.options import _KNOWN, LoopOptions, OptionsError
from verl_ext.plugin.preflight import PreflightError, check_config

LOOP_KEY = "actor_rollout_ref.rollout.agent.default_agent_loop"


@pytest.mark.parametrize(
    ("preset", "loop", "mode"),
    [("warn", "verl_ext_tool_agent", "warn"), ("strict", "verl_ext_tool_agent", "strict"),
     ("audit", "verl_ext_audited_tool_agent", "warn")],
)  # fmt: skip
def test_presets_compose_with_verls_ppo_trainer_from_the_command_line(preset, loop, mode):
    # no hydra.searchpath override: the installed plugin (hydra_plugins/verl_ext_searchpath) puts the group there
    cfg = verl_config([f"+verl_ext={preset}", "verl_ext.records.dir=/tmp/records"])  # then options without a `+`
    assert OmegaConf.select(cfg, LOOP_KEY) == loop
    assert cfg.verl_ext.check.mode == mode and cfg.verl_ext.records.dir == "/tmp/records"
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    assert cfg.trainer.total_epochs is not None  # verl's own config is all there
    assert check_config(cfg)[0].startswith(f"verl_ext: options checked before Ray starts: loop {loop}, check {mode}")


def test_the_documented_searchpath_override_selects_the_group_too():
    cfg = verl_config(["hydra.searchpath=[pkg://verl_ext.configs]", "+verl_ext=strict"])
    assert cfg.verl_ext.check.mode == "strict"


def test_an_unknown_preset_is_refused_by_hydra_with_the_available_ones():
    from hydra.errors import ConfigCompositionException

    available = r"(?s)Available options in 'verl_ext':\s+audit\s+gateway\s+strict\s+warn"
    with pytest.raises(ConfigCompositionException, match=available):
        verl_config(["+verl_ext=verl_ext"])  # used to be accepted as a string and change nothing


def test_the_warn_preset_lists_every_option():
    options = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "verl_ext" / "warn.yaml"))["verl_ext"]
    assert set(options) == _KNOWN[""] - {"harness"}  # the gateway preset lists those (test_gateway_preset)
    for section in ("check", "records"):
        assert set(options[section]) == _KNOWN[section]
    assert LoopOptions.from_mapping(options) == LoopOptions()  # and each at the default the dataclasses define
    assert sorted(p.stem for p in (CONFIG_DIR / "verl_ext").glob("*.yaml")) == sorted(PRESETS)


def test_a_string_where_the_options_belong_says_how_to_get_the_group():
    cfg = OmegaConf.create({"verl_ext": "strict", "actor_rollout_ref": {"rollout": {"agent": {
        "default_agent_loop": "verl_ext_tool_agent", "agent_loop_config_path": None}}}})  # fmt: skip
    with pytest.raises(OptionsError, match=r"hydra.searchpath=\[pkg://verl_ext.configs\]"):
        check_config(cfg)


def write_rows(path: Path, agent_name: str, n: int = 3) -> Path:
    import pandas as pd

    from verl_ext.demo.data import make_rows

    pd.DataFrame([{**row, "agent_name": agent_name} for row in make_rows(n, "train")]).to_parquet(path)
    return path


def test_rows_naming_tool_agent_are_announced_as_switched(tmp_path):
    train = write_rows(tmp_path / "train.parquet", "tool_agent")
    cfg = verl_config(["+verl_ext=warn", f"data.train_files={train}"])
    lines = check_config(cfg)
    assert any("3 rows naming tool_agent in the agent_name column run verl_ext_tool_agent" in line for line in lines)


def test_rows_naming_another_loop_are_announced_as_bypassing(tmp_path):
    train = write_rows(tmp_path / "train.parquet", "single_turn_agent")
    lines = check_config(verl_config(["+verl_ext=warn", f"data.train_files={train}"]))
    assert any("WARNING" in line and "3 rows naming single_turn_agent" in line for line in lines), lines


def test_stop_mode_refuses_the_dataset_before_ray_starts(tmp_path):
    train = write_rows(tmp_path / "train.parquet", "tool_agent")
    cfg = verl_config(["+verl_ext=strict", "verl_ext.agent_name_column=stop", f"data.train_files={train}"])
    named = r"data.train_files .*train.parquet \(3 rows\) has agent_name='tool_agent'"
    with pytest.raises(PreflightError, match=named):
        check_config(cfg)


def test_options_of_a_loop_entry_in_agent_loop_config_path_are_checked(tmp_path):
    loops = tmp_path / "loops.yaml"
    loops.write_text(
        "- name: my_loop\n  _target_: verl_ext.plugin.agent_loop.VerlExtToolAgentLoop\n  verl_ext:\n"
        "    check: {mode: loud}\n"
    )
    cfg = verl_config([f"{LOOP_KEY}=my_loop", f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}"])
    with pytest.raises(OptionsError, match="mode"):
        check_config(cfg)


@pytest.mark.parametrize("source", ["yaml", "override"])
def test_mode_off_unquoted_is_off_though_yaml_reads_it_as_false(source):
    """`mode: off` in YAML and `verl_ext.check.mode=off` on the command line both reach us as False."""
    if source == "yaml":
        options = OmegaConf.create("check:\n  mode: off\n")
    else:
        options = OmegaConf.from_dotlist(["check.mode=off"])
    assert options.check.mode is False
    assert LoopOptions.from_sources(options).check.mode is CheckMode.OFF
    with pytest.raises(OptionsError, match=r"verl_ext.check.mode must be one of .*got True"):
        LoopOptions.from_sources(OmegaConf.create("check:\n  mode: on\n"))


def test_nothing_is_said_when_verl_ext_is_not_used():
    assert check_config(verl_config([f"{LOOP_KEY}=tool_agent"])) == []


def test_a_misspelled_option_stops_main_ppo_in_the_driver_with_the_error_last():
    # verl's real entry point; the preflight runs inside validate_config, before ray.init
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "+verl_ext=strict", "+verl_ext.chek.mode=warn"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].strip().startswith("unknown option verl_ext.chek; known keys")
    assert "Traceback" not in out.stderr and "ray init" not in out.stdout


def test_the_built_wheel_ships_the_group_and_the_search_path_plugin(tmp_path):
    import shutil
    import zipfile

    src = tmp_path / "src"  # built from a copy: an in-tree build leaves build/ and egg-info beside the checkout
    for package in ("verl_ext", "hydra_plugins"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."]
    subprocess.run(cmd, cwd=src, check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("verl_ext-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = {f"verl_ext/configs/verl_ext/{p}.yaml" for p in PRESETS}
    shipped = {"verl_ext/configs/agent_loops.yaml"}
    assert presets | shipped | {"hydra_plugins/verl_ext_searchpath/__init__.py"} <= names


# -- every option: a wrong type, an unknown key or an out-of-range value is one line naming the key -------------
@pytest.mark.parametrize(
    ("options", "key", "fix"),
    [
        ({"chek": {}}, "verl_ext.chek", "did you mean verl_ext.check?"),
        ({"check": {"mod": "warn"}}, "verl_ext.check.mod", "did you mean verl_ext.check.mode?"),
        ({"records": {"max_file": 2}}, "verl_ext.records.max_file", "did you mean verl_ext.records.max_files?"),
        ({"check": []}, "verl_ext.check", "must be a mapping"),  # used to mean "the defaults"
        ({"records": False}, "verl_ext.records", "must be a mapping"),
        ({"check": {"template_view_rate": True}}, "verl_ext.check.template_view_rate", "must be a number"),
        ({"check": {"template_view_rate": "0.5"}}, "verl_ext.check.template_view_rate", "without quotes"),
        ({"check": {"template_view_rate": 1.5}}, "verl_ext.check.template_view_rate", "from 0 to 1"),
        ({"check": {"logprob_atol": float("inf")}}, "verl_ext.check.logprob_atol", "finite number 0 or more"),
        ({"check": {"logprob_atol": -1e-5}}, "verl_ext.check.logprob_atol", "0 or more"),
        ({"check": {"template_view_budget_s": 0}}, "verl_ext.check.template_view_budget_s", "or null"),
        ({"check": {"mode": ["warn"]}}, "verl_ext.check.mode", "'strict', 'warn', 'off'"),
        ({"check": {"mode": "loud"}}, "verl_ext.check.mode", "one of ['strict', 'warn', 'off'], got 'loud'"),
        ({"check": {"allowed_causes": {"bpe_remerge": 1}}}, "verl_ext.check.allowed_causes", "a list of cause names"),
        ({"check": {"allowed_causes": ["bpe"]}}, "verl_ext.check.allowed_causes[0]", "'bpe_remerge', "),
        ({"records": {"dir": 5}}, "verl_ext.records.dir", "a folder path"),  # used to become the folder '5'
        ({"records": {"max_bytes": "64MB"}}, "verl_ext.records.max_bytes", "positive integer"),
        ({"records": {"max_files": 0}}, "verl_ext.records.max_files", "positive integer"),
        ({"tool_timeout_s": float("nan")}, "verl_ext.tool_timeout_s", "positive finite number"),  # was accepted
        ({"tool_timeout_s": "30"}, "verl_ext.tool_timeout_s", "positive finite number"),
        ({"escape_special_tokens": "false"}, "verl_ext.escape_special_tokens", "true or false"),
        ({"extra_stop_tokens": "</tool_call>"}, "verl_ext.extra_stop_tokens", "a list of token strings"),  # letters
        ({"extra_stop_tokens": [151657]}, "verl_ext.extra_stop_tokens[0]", "a token's text"),  # encoded as digits
        ({"extra_stop_tokens": [""]}, "verl_ext.extra_stop_tokens[0]", "non-empty string"),
        ({"agent_name_column": "drop"}, "verl_ext.agent_name_column", "one of ['switch', 'stop', 'keep']"),
        ({"numerics": {"drift_mean_abs_delta": 0}}, "verl_ext.numerics.drift_mean_abs_delta", "the default is 0.05"),
        ({"numerics": {"token_abs_delta": "0.5"}}, "verl_ext.numerics.token_abs_delta", "positive finite number"),
        ({"numerics": {"depth_edges": [512, 1024]}}, "verl_ext.numerics.depth_edges", "put 0 first: [0, 512, 1024]"),
        ({"numerics": {"depth_edges": [0, 8, 4]}}, "verl_ext.numerics.depth_edges", "sort them"),
        ({"numerics": {"depth_edges": 512}}, "verl_ext.numerics.depth_edges", "non-empty list of integer"),
        (
            {"numerics": {"token_abs_delt": 1}},
            "verl_ext.numerics.token_abs_delt",
            "did you mean verl_ext.numerics.token_abs_delta",
        ),
        ({"numerics": [0.05]}, "verl_ext.numerics", "must be a mapping of options"),
        ({"numerics": {"policy": "mask"}}, "verl_ext.numerics.policy", "write verl_ext.numerics.policy=warn or"),
        ({"numerics": {"policy": True}}, "verl_ext.numerics.policy", "one of ['warn', 'strict']"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_key_and_the_fix(options, key, fix):
    with pytest.raises(OptionsError) as raised:
        LoopOptions.from_sources(options)
    message = str(raised.value)
    assert key in message and fix in message, message
    assert "\n" not in message


def test_values_in_range_are_taken_as_given(tmp_path):
    options = LoopOptions.from_sources(
        {"check": {"template_view_rate": 0, "logprob_atol": 0, "template_view_budget_s": None, "allowed_causes": []}},
        {"records": {"dir": tmp_path}, "extra_stop_tokens": ["</tool_call>"], "tool_timeout_s": 1},
    )
    assert options.check.template_view_rate == 0.0 and options.check.template_view_budget_s is None
    assert options.check.allowed_causes == frozenset() and options.records.dir == str(tmp_path)
    assert options.extra_stop_tokens == ("</tool_call>",) and options.tool_timeout_s == 1.0


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(), st.text(max_size=6), st.sampled_from(["warn"])
    ),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=2),
    max_leaves=4,
)
KEYS = [(key,) for key in sorted(_KNOWN[""])] + [
    (section, key) for section in ("check", "records", "harness", "numerics") for key in sorted(_KNOWN[section])
]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(path=st.sampled_from(KEYS + [("check", "x"), ("y",)]), value=JSON_VALUES)
def test_any_value_of_any_option_is_taken_or_refused_in_one_line_naming_it(path, value):
    options: dict = {path[0]: value} if len(path) == 1 else {path[0]: {path[1]: value}}
    try:
        parsed = LoopOptions.from_sources(options)
    except OptionsError as exc:
        message = str(exc)
        assert "verl_ext." + path[0] in message and "\n" not in message, message
        return
    if path == ("extra_stop_tokens",):
        assert list(parsed.extra_stop_tokens) == list(value or [])  # never split or converted
    if path == ("records", "dir"):
        assert parsed.records.dir == (value or None)
    if path in (("tool_timeout_s",), ("check", "logprob_atol"), ("check", "template_view_rate")):
        number = parsed.tool_timeout_s if path == ("tool_timeout_s",) else getattr(parsed.check, path[1])
        assert math.isfinite(number) and number == value and not isinstance(value, bool)


LOOP_ENTRY = "- name: my_loop\n  _target_: verl_ext.plugin.agent_loop.VerlExtToolAgentLoop\n"


@pytest.mark.parametrize(
    ("content", "fix"),
    [
        (None, "cannot be read (FileNotFoundError"),
        ("DIR", "cannot be read (IsADirectoryError"),
        (b"\xff\xfe- name: x\n", "cannot be read (UnicodeDecodeError"),
        ("- name: [x\n", "not valid YAML at line 2"),
        ("5\n", "cannot be read"),
        ("name: my_loop\n_target_: x\n", "expected a YAML list of agent loops"),
        ("- _target_: a.b\n", "entry 0 must be a mapping with a string 'name'"),
        ("- just_a_string\n", "entry 0 must be a mapping"),
    ],
)  # each was a traceback from inside verl's validate_config
def test_a_broken_agent_loop_config_file_is_one_line_naming_it(tmp_path, content, fix):
    loops = tmp_path / "loops.yaml"
    if content == "DIR":
        loops.mkdir()
    elif isinstance(content, bytes):
        loops.write_bytes(content)
    elif content is not None:
        loops.write_text(content)
    cfg = verl_config(["+verl_ext=warn", f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}"])
    with pytest.raises(PreflightError) as raised:
        check_config(cfg)
    message = str(raised.value)
    assert message.startswith(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}: "), message
    assert fix in message and "\n" not in message, message


def test_a_bad_option_in_a_loop_entry_names_the_file_and_the_loop(tmp_path):
    loops = tmp_path / "loops.yaml"
    loops.write_text(LOOP_ENTRY + "  verl_ext:\n    extra_stop_tokens: </tool_call>\n")
    cfg = verl_config([f"{LOOP_KEY}=my_loop", f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}"])
    with pytest.raises(OptionsError, match=rf"^{loops}: the verl_ext key of agent loop 'my_loop': verl_ext.extra_stop"):
        check_config(cfg)


# -- what turns verl_ext off: each stops the driver before Ray starts, in one line ------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # a misspelling: was a warning here, then an AssertionError inside an agent-loop worker
        ([f"{LOOP_KEY}=verl_ext_tool_agnet"], r"^actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_"
         r"agnet is not a registered agent loop \(did you mean verl_ext_tool_agent"),
        ([f"{LOOP_KEY}=my_tool_agent"], r"my_tool_agent is not a registered agent loop .*agent_loop_config_path"),
        (["actor_rollout_ref.rollout.multi_turn.enable=false"],
         r"^actor_rollout_ref.rollout.multi_turn.enable=false with default_agent_loop=verl_ext_tool_agent: .* Fix"),
        (["actor_rollout_ref.rollout.calculate_log_probs=false"],
         r"^actor_rollout_ref.rollout.calculate_log_probs=false with default_agent_loop=verl_ext_tool_agent: .* Fix"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("preset", ["warn", "audit"])
def test_a_setting_that_turns_verl_ext_off_is_one_line_before_ray_starts(preset, overrides, message):
    from verl_ext.plugin.loop_routing import UnknownLoopError

    if preset == "audit":
        message = message.replace("verl_ext_tool_agent:", "verl_ext_audited_tool_agent:")
    cfg = verl_config([f"+verl_ext={preset}", *overrides])
    with pytest.raises((PreflightError, UnknownLoopError)) as raised:
        check_config(cfg)
    assert re.search(message, str(raised.value)) and "\n" not in str(raised.value), str(raised.value)


def test_a_misspelled_loop_without_a_preset_is_refused_too():
    with pytest.raises(ValueError, match="verl_ext_audited_tool_agen is not a registered agent loop"):
        check_config(verl_config([f"{LOOP_KEY}=verl_ext_audited_tool_agen"]))


def test_calculate_log_probs_may_be_off_when_the_check_is_off():
    off = ["verl_ext.check.mode=off", "actor_rollout_ref.rollout.calculate_log_probs=false"]
    cfg = verl_config(["+verl_ext=warn", *off])
    assert check_config(cfg)[0].startswith("verl_ext: options checked before Ray starts")


def test_a_records_folder_the_driver_cannot_create_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    cfg = verl_config(["+verl_ext=warn", f"verl_ext.records.dir={tmp_path / 'file' / 'records'}"])
    with pytest.raises(PreflightError, match=r"^verl_ext.records.dir=.*/file/records: cannot be created or written .*"
                       r"\(NotADirectoryError: Not a directory\)\. Fix: a folder every node can create"):  # fmt: skip
        check_config(cfg)
    ok = tmp_path / "records" / "run1"
    assert "records " + str(ok) in check_config(verl_config(["+verl_ext=warn", f"verl_ext.records.dir={ok}"]))[0]
    assert ok.is_dir() and not list(ok.iterdir())  # created, and the write check left nothing behind


def test_every_preset_sets_what_its_loop_needs():
    for preset in PRESETS:
        rollout = verl_config([f"+verl_ext={preset}"]).actor_rollout_ref.rollout
        assert rollout.multi_turn.enable is True and rollout.calculate_log_probs is True, preset


def test_a_misspelled_loop_stops_main_ppo_with_exit_2_and_no_traceback():
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "+verl_ext=warn", f"{LOOP_KEY}=verl_ext_tool_agnet"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "did you mean verl_ext_tool_agent " in out.stderr.strip().splitlines()[-1]
    assert "Traceback" not in out.stderr


def _pasted(fix: str, folder: Path) -> list[str]:
    """The words bash passes to a command when ``fix`` is pasted after it (in ``folder``: an unquoted ``>`` would
    create a file there)."""
    done = subprocess.run(["bash", "-c", f"printf '%s\\n' {fix}"], cwd=folder, capture_output=True, text=True)
    assert done.returncode == 0 and not done.stderr and not list(folder.iterdir()), (fix, done.stderr)
    return done.stdout.splitlines()


@pytest.mark.parametrize("source", ["the option's error", "docs/troubleshooting.md"])
def test_the_extra_stop_tokens_fix_works_pasted_into_bash(source, tmp_path):
    if source == "the option's error":
        with pytest.raises(OptionsError) as raised:
            LoopOptions.from_sources({"extra_stop_tokens": "</tool_call>"})
        fix = str(raised.value).split("e.g. ", 1)[1]
    else:
        row = next(
            line
            for line in (REPO / "docs" / "troubleshooting.md").read_text().splitlines()
            if line.startswith("| `verl_ext.extra_stop_tokens must be")
        )
        fix = re.findall(r"`([^`]*extra_stop_tokens=[^`]*)`", row)[-1]  # the fix column's command
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (word,) = _pasted(fix, tmp_path)  # one argument, as typed: `<` and `>` are no redirections, `[...]` no glob
    (override,) = OverridesParser.create().parse_overrides([word])
    assert override.key_or_group == "verl_ext.extra_stop_tokens" and override.value() == ["</tool_call>"]
    assert LoopOptions.from_sources({"extra_stop_tokens": override.value()}).extra_stop_tokens == ("</tool_call>",)


def test_an_unquoted_special_token_stops_main_ppo_with_the_quoted_fix_not_a_lexer_error():
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    override = "verl_ext.extra_stop_tokens=[</tool_call>]"
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "+verl_ext=warn", override]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "LexerNoViableAltException" not in out.stderr, out.stderr[-2000:]
    # Hydra prints the message, then its own line on HYDRA_FULL_ERROR
    said = [line for line in out.stderr.splitlines() if line.startswith("Hydra cannot read the override")]
    assert said == [said[0]] and f"{override!r}" in said[0], out.stderr[-2000:]
    assert said[0].endswith("""'verl_ext.extra_stop_tokens=["</tool_call>"]'"""), said
