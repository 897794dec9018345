"""``verl_ext.harness``: the harness ``verl_ext_gateway_agent`` runs per dataset row, validated, and the checks that it
can run (the callable imports and takes the loop's keywords; the command's program exists), shared by the driver's
preflight and the loop itself so both say the same thing.

The options come from the ``verl_ext.harness`` section (the ``gateway`` preset lists them) and, over it, from the
``harness`` key of the loop's entry in ``rollout.agent.agent_loop_config_path``. This module imports neither verl nor
Ray: the preflight runs it in the driver before Ray starts.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import shlex
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from verl_ext.core.errors import OptionsError
from verl_ext.core.option_rules import reject_unknown

SECTION = "verl_ext.harness"
GATEWAY_LOOP = "verl_ext_gateway_agent"
# the keywords the loop calls a harness function with
HARNESS_KEYWORDS = ("base_url", "api_key", "row")
BRANCHES = ("last", "all")
# branches=all hands verl one sample per trained branch. Sound only under verl 0.9.1's v1 trainer: its worker
# (trainer/ppo/v1/agent_loop_tq.py, AgentLoopWorkerTQ._agent_loop_postprocess) stores a list of outputs per session,
# and its GRPO advantage (v1/utils.py, compute_advantage_for_multi_trajectories) gives every output of a session the
# last one's. The v0 worker (agent_loop.py, _agent_loop_postprocess) takes exactly one output per row.
_ALL_FIX = f"Fix: {{fix}}, or {SECTION}.branches=last (the session's last branch is trained; every branch is still "
_ALL_FIX += "checked and recorded)"
V0_TRAINER_REFUSED = (
    f"{SECTION}.branches=all needs verl's v1 trainer: verl 0.9.1's v0 trainer takes exactly one agent-loop output "
    f"per row, so a session can hand it one branch only. " + _ALL_FIX.format(fix="trainer.use_v1=true (the default)")
)


def branches_all_refusal(trainer_config: Any) -> str | None:
    """Why verl's trainer ``trainer_config`` cannot train every branch of a session as its own sample, with the fix;
    None where it can (verl 0.9.1's v1 trainer with GRPO and no distillation). Reads the config only (no verl)."""
    trainer = trainer_config.get("trainer") or {}
    if not trainer.get("use_v1", True):
        return V0_TRAINER_REFUSED
    estimator = str((trainer_config.get("algorithm") or {}).get("adv_estimator", "grpo"))
    if estimator != "grpo":
        return (
            f"{SECTION}.branches=all needs algorithm.adv_estimator=grpo, got {estimator}: verl 0.9.1's v1 trainer "
            "gives every output of a session its last output's advantage only under GRPO "
            "(compute_advantage_for_multi_trajectories); under other estimators each branch would be a sample of its "
            "own, with the session's reward. " + _ALL_FIX.format(fix="algorithm.adv_estimator=grpo")
        )
    if (trainer_config.get("distillation") or {}).get("enabled", False):
        return (
            f"{SECTION}.branches=all does not work with distillation.enabled=true: verl 0.9.1's v1 worker computes "
            "teacher logprobs for a session's last output only. " + _ALL_FIX.format(fix="distillation.enabled=false")
        )
    return None


# shell words that are not programs: a command starting with one is run as written, its program not looked up
_SHELL_WORDS = frozenset(
    {"cd", "set", "export", "source", ".", "eval", "exec", "if", "for", "while", "case", "{", "(", "!", "time"}
)


@dataclass(frozen=True)
class HarnessOptions:
    """``verl_ext.harness``: each field is an option key with its default (defined here only). Exactly one of
    ``function`` and ``command`` names the harness where ``verl_ext_gateway_agent`` runs (``required``)."""

    function: str | None = None  # module:function, called with base_url=, api_key=, row= (async or sync)
    command: str | None = None  # a shell command line, run with OPENAI_BASE_URL, OPENAI_API_KEY and VERL_EXT_ROW set
    timeout_s: float = 600.0  # per row; past it the rollout ends and nothing of it is trained
    branches: str = "last"  # "last": the session's last branch is the row's sample; "all": every branch is one
    max_branches: int = 8  # per session; a request that would fork one more ends the session (409)

    @classmethod
    def from_mapping(
        cls, value: Mapping[str, Any] | None, base: HarnessOptions | None = None, where: str = SECTION
    ) -> HarnessOptions:
        """``value`` over ``base`` (an absent key keeps ``base``'s value); ``where`` names the section in errors
        (``verl_ext.harness``, or the loop entry's ``harness`` key). Raises ``OptionsError``, one line naming the key
        and the fix, for an unknown key or a bad value; a harness named both ways. (Whether the trainer can take
        ``branches: all`` is ``branches_all_refusal``'s to say.)"""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise OptionsError(
                f"{where} must be a mapping of options (or null), got {value!r}; e.g. "
                f"{SECTION}.function=module:function"
            )
        reject_unknown(where, value, {f.name for f in fields(cls)})
        options = replace(base or cls(), **{str(k): v for k, v in value.items()})
        for key in ("function", "command"):
            text = getattr(options, key)
            if text is not None and (not isinstance(text, str) or not text.strip()):
                raise OptionsError(f"{where}.{key} must be a non-empty string or null, got {text!r}")
        if options.function is not None:
            module, _, name = options.function.partition(":")
            if not module.strip() or not name.strip():
                raise OptionsError(
                    f"{where}.function must be module:function (e.g. my_agents.calculator:run), got "
                    f"{options.function!r}"
                )
        if options.function is not None and options.command is not None:
            raise OptionsError(
                f"{where}: both function ({options.function!r}) and command ({options.command!r}) are set; set one "
                f"(the other null, e.g. {SECTION}.command=null)"
            )
        timeout = options.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (0 < timeout < math.inf):
            raise OptionsError(f"{where}.timeout_s must be a positive finite number of seconds, got {timeout!r}")
        if options.branches not in BRANCHES:
            raise OptionsError(
                f"{where}.branches must be 'last' (the session's last branch is trained) or 'all' (every branch, each "
                f"engine turn once), got {options.branches!r}"
            )
        branches = options.max_branches
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise OptionsError(f"{where}.max_branches must be a positive integer, got {branches!r}")
        return replace(options, timeout_s=float(timeout))

    def required(self) -> HarnessOptions:
        """These options, where a harness is named; else ``OptionsError`` saying how to name one."""
        if self.function is None and self.command is None:
            raise OptionsError(
                f"{GATEWAY_LOOP} has no harness: set {SECTION}.function=module:function (called with base_url=, "
                f"api_key=, row=) or {SECTION}.command='...' (run with OPENAI_BASE_URL and OPENAI_API_KEY set)"
            )
        return self

    def describe(self) -> str:
        """One line for the driver's log: which harness, its timeout and branch cap."""
        what = f"function {self.function}" if self.function is not None else f"command {self.command!r}"
        trains = "trains the last" if self.branches == "last" else "trains every branch, each engine turn once"
        return f"harness {what} (timeout {self.timeout_s:g} s, at most {self.max_branches} branches, {trains})"


class HarnessSpecError(OptionsError):
    """The harness named in the options cannot run: the callable does not import, is not callable or does not take
    the loop's keywords; the command's program is not there."""


def resolve_function(spec: str) -> Callable[..., Any]:
    """The harness callable ``module:function`` names (``function`` may be dotted: ``module:Class.method``). Raises
    ``HarnessSpecError``, one line naming the spec, the cause and the fix."""
    module_name, _, path = spec.partition(":")
    fix = "Fix: a module on the Python path of every node (ship it with the job's working_dir, or install it)"
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # user code: any error its import raises is the user's to see, in one line
        raise HarnessSpecError(
            f"{SECTION}.function={spec}: cannot import {module_name} ({type(exc).__name__}: {_one_line(exc)}). {fix}"
        ) from None
    for part in path.split("."):
        if not hasattr(target, part):
            raise HarnessSpecError(f"{SECTION}.function={spec}: {module_name} has no {path}. {fix}, as module:function")
        target = getattr(target, part)
    if not callable(target):
        raise HarnessSpecError(f"{SECTION}.function={spec}: {path} is a {type(target).__name__}, not a function")
    try:
        inspect.signature(target).bind(**dict.fromkeys(HARNESS_KEYWORDS))
    except TypeError as exc:
        raise HarnessSpecError(
            f"{SECTION}.function={spec}: {path} cannot be called with the keywords {', '.join(HARNESS_KEYWORDS)} "
            f"({exc}). Fix: def {path.rsplit('.', 1)[-1]}(base_url, api_key, row), async or not"
        ) from None
    except ValueError:  # no signature to read (a builtin): it is called as it is
        pass
    return target


def check_command(command: str) -> None:
    """Raises ``HarnessSpecError`` when ``command`` does not split as a shell line, or its program (the first word
    after ``KEY=VALUE`` assignments) is neither on ``PATH`` nor an executable file. A command starting with a shell
    word (``cd``, ``exec``, ...) is not looked into."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise HarnessSpecError(f"{SECTION}.command={command!r} does not parse as a shell line ({exc})") from None
    program = next((w for w in words if not _is_assignment(w)), "")
    if not program or program in _SHELL_WORDS:
        return
    if os.sep in program:
        if os.path.isfile(program) and os.access(program, os.X_OK):
            return
        why = "is not an executable file" if os.path.exists(program) else "does not exist"
        raise HarnessSpecError(
            f"{SECTION}.command={command!r}: {program} {why} (relative paths are from the driver's folder, "
            f"{os.getcwd()}). Fix: an executable path every node has, or a program on PATH"
        )
    if shutil.which(program) is None:
        raise HarnessSpecError(
            f"{SECTION}.command={command!r}: no program {program!r} on PATH in the driver. Fix: install it on every "
            "node, or name it by its full path"
        )


def check_harness(options: HarnessOptions) -> None:
    """The preflight's check that the named harness can run (``resolve_function`` or ``check_command``)."""
    options.required()
    if options.function is not None:
        resolve_function(options.function)
    else:
        check_command(options.command or "")


def _is_assignment(word: str) -> bool:
    name, equals, _ = word.partition("=")
    return bool(equals) and name.isidentifier()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
