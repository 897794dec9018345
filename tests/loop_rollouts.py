"""Rollouts built from arbitrary engine output exactly as ``verl_ext_tool_agent`` builds them.

The loop's own steps, without verl's worker around them: the first prompt rendered by the trajectory, each turn's
output cut to what is left of the response budget, its finish reason judged from the ids (``judge_finish``),
invalid output ending the rollout, the message read by verl's real tool parser (``tool_calls.parse_turn``, the
function the loop calls), the sampled ids kept as sampled, and the calls answered with tool messages (or, where
the template allows it, the turn followed by a user message). The check then sees the same
``Rollout`` the loop would hand it.

Engine output comes from ``engine_outputs``: pieces of text real models emit around a template's own tool-call
text (leading newlines, indentation, code fences, trailing spaces, non-breaking spaces, stray think tags, a partial
UTF-8 character), each piece encoded on its own (so the ids are a split the model may sample, not always the
canonical one), mixed with random ids over the vocabulary, ended by a stop, an alias, or the length limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from rollouts import PROMPT, TOOLS

from verl_ext.check.inputs import EngineCall, trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.core.engine_output import validate_engine_output
from verl_ext.core.errors import TemplateError
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import TemplateProfile
from verl_ext.core.trajectory import FinishReason, TokenTrajectory
from verl_ext.core.turn_end import judge_finish
from verl_ext.plugin.agent_loop import _malformed_message
from verl_ext.plugin.tool_calls import over_limit_message, parse_turn

# What real models emit besides the template's own canonical text.
ODD_TEXT = [
    "\n",
    "\n\n",
    " ",
    "  ",
    "\t",
    "    return x\n",
    "```python\nprint(1)\n```",
    "\u00a0",
    "text ",
    "The answer is 2.",
    "<think>",
    "</think>",
    "<think>\nhm\n</think>\n\n",
    '{"a": 1}',
    "คาร์",
    "中文",
    "🙂",
    "  \n",
    "<tool_call>",
    "</tool_call>",
]


def verl_parser(renderer: ChatRenderer, profile: TemplateProfile) -> Any:
    """verl's tool parser for this template's tool-call text: ``gpt-oss`` for the harmony format, else ``hermes``
    (which reads ``<tool_call>`` JSON and returns any other text as content, as verl's default does)."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    fmt = "gpt-oss" if "<|channel|>" in renderer.tokenizer.get_vocab() else "hermes"
    return ToolParser.get_tool_parser(fmt, renderer.tokenizer)


@dataclass
class LoopRollout:
    """A rollout as the loop built it: the trajectory, its engine calls, and the ``Rollout`` the check reads."""

    trajectory: TokenTrajectory
    calls: list[EngineCall] = field(default_factory=list)
    ended: str = ""

    def rollout(self, response_length: int, tools: Sequence[Mapping[str, Any]] | None, prompt_messages: int) -> Rollout:
        sample = trainer_sample_from_trajectory(self.trajectory, response_length)
        return Rollout.of(
            self.calls,
            sample,
            self.trajectory.messages,
            tools,
            prompt_messages=prompt_messages,
            response_length=response_length,
        )


def build_loop_rollout(
    renderer: ChatRenderer,
    profile: TemplateProfile,
    parser: Any,
    outputs: Sequence[Sequence[int]],
    tool_texts: Sequence[str | list[dict[str, Any]]],
    *,
    response_length: int = 512,
    tools: Sequence[Mapping[str, Any]] | None = TOOLS,
    prompt: Sequence[Mapping[str, Any]] = PROMPT,
    user_after_text: bool = False,
    max_parallel_calls: int = 1,
    roles_after_text: Sequence[str] = ("user",),
    call_reader: Any = None,
    answer_malformed: bool = True,
) -> tuple[LoopRollout, Rollout]:
    """Drive a trajectory through ``outputs`` (one engine output per turn) as the loop does; ``tool_texts`` answer
    the calls in order (a text, or content as a list of parts). With ``user_after_text``, a turn without a call is
    followed by a message per role of ``roles_after_text`` (by default one user message; their contents drawn from
    ``tool_texts`` too) instead of ending the rollout (a multi-turn chat). Returns the loop's state and the
    ``Rollout`` the check reads. ``call_reader``: the reader derived from the template, as the loop passes it to
    ``parse_turn`` (``parser`` None: the derived reader alone). ``answer_malformed``: each call the parser could not
    read is answered with the loop's error message (the gateway leaves that to the harness: False)."""
    t = TokenTrajectory(renderer, profile)
    lr = LoopRollout(t)
    prompt_ids = t.start([dict(m) for m in prompt], tools)
    first = len(prompt_ids)
    end_ids = frozenset(s.id for s in profile.stop_ids if set(s.sources) - {"user"})
    schemas = tool_schemas(tools)
    texts = iter([*tool_texts, *["ok"] * 64])
    for turn, out in enumerate(outputs):
        remaining = response_length - (len(t.input_ids) - first)
        if remaining <= 0:
            lr.ended = "budget"
            break
        ids = list(out[:remaining])
        finish = judge_finish(ids, remaining, [], profile)
        lps = [-0.01 * (turn + 1) - 0.001 * i for i in range(len(ids))]
        lr.calls.append(EngineCall.of(prompt_ids, ids, lps, finish.value))
        if validate_engine_output(ids, lps, renderer.vocab_size, stop_ids=profile.stop_id_set):
            t.add_sampled(ids, lps, finish)
            lr.ended = "invalid"
            break
        gen = profile.generation_prompt_ids
        parsed = asyncio.run(
            parse_turn(
                parser,
                ids,
                end_ids,
                renderer.decode,
                schemas,
                turn,
                max_parallel_calls,
                generation_prompt=gen,
                call_reader=call_reader,
            )
        )
        t.add_sampled(ids, lps, finish, message=parsed.message)
        if finish is FinishReason.LENGTH or turn == len(outputs) - 1:
            lr.ended = "length" if finish is FinishReason.LENGTH else "last"
            break
        replies = [
            {"role": "tool", "content": next(texts), "tool_call_id": c.call_id, "name": c.name} for c in parsed.calls
        ]
        replies += [over_limit_message(c, max_parallel_calls) for c in parsed.dropped]
        if answer_malformed:  # as the loop answers them
            replies += [_malformed_message(turn, i) for i in range(parsed.malformed)]
        if not replies:
            if not user_after_text:
                lr.ended = "no call"
                break
            replies = [{"role": role, "content": next(texts) or "go on"} for role in roles_after_text]
        try:
            prompt_ids = t.append_messages(replies)
        except TemplateError as exc:
            lr.ended = f"refused: {exc}"
            break
    t.finish()
    return lr, lr.rollout(response_length, tools, len(prompt))


def tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> list[Any]:
    """The tools as the loop hands them to verl's parser (``OpenAIFunctionToolSchema``; some parsers read the names)."""
    from verl.tools.schemas import OpenAIFunctionToolSchema

    return [OpenAIFunctionToolSchema.model_validate(dict(t)) for t in tools or ()]


def parse_text(
    parts: Mapping[str, Any],
    text: str,
    tools: Sequence[Mapping[str, Any]],
    reader: Any = "derived",
    parser: Any = "verl",
) -> Any:
    """``parse_turn`` of a turn's ``text`` (its close id appended) as the loop reads it: ``parts`` holds the renderer
    ``r``, its ``profile``, verl's ``parser`` and the derived ``reader``; ``reader``/``parser`` replace them."""
    from verl_ext.core.turn_end import end_of_turn_ids
    from verl_ext.core.turn_parse import parse_turn as parse_ids

    r, profile = parts["r"], parts["profile"]
    ids = [*r.encode(text), min(profile.close_id_set)]
    return asyncio.run(
        parse_ids(
            parts["parser"] if parser == "verl" else parser,
            ids,
            end_of_turn_ids(profile),
            r.decode,
            tool_schemas(tools),
            0,
            None,
            generation_prompt=profile.generation_prompt_ids,
            call_reader=parts["reader"] if reader == "derived" else reader,
        )
    )


def canonical_call_text(renderer: ChatRenderer, profile: TemplateProfile, arguments: Any) -> str:
    """The text the template renders for one assistant tool call (between the generation prompt and the close):
    what a model trained on this template writes to call a tool."""
    function = {"name": "calculator", "arguments": arguments}
    tool_call = {"id": "call00001", "type": "function", "function": function}
    return canonical_message_text(renderer, profile, {"role": "assistant", "content": "", "tool_calls": [tool_call]})


def canonical_message_text(renderer: ChatRenderer, profile: TemplateProfile, message: Mapping[str, Any]) -> str:
    """The text the template renders for one assistant message after the prompt (between the generation prompt and
    the close): what a model trained on this template writes for it. Empty where the template cannot render it."""
    try:
        body = renderer.render_text([*PROMPT, message], TOOLS, add_generation_prompt=False)
        head = renderer.render_text(PROMPT, TOOLS, add_generation_prompt=True)
    except Exception:
        return ""
    if not body.startswith(head):
        return ""
    text = body[len(head) :]
    for close in sorted(profile.close_id_set):
        cut = text.rfind(renderer.decode([close]))
        if cut > 0:
            return text[:cut]
    return text


@st.composite
def engine_output(draw: Any, renderer: ChatRenderer, profile: TemplateProfile, call_texts: Sequence[str]) -> list[int]:
    """One engine output: a few pieces (odd text, the template's tool-call text, random ids), each encoded on its
    own, then a stop id, an alias, or nothing (the length limit or a cut)."""
    vocab = renderer.vocab_size
    piece = st.one_of(
        st.sampled_from(ODD_TEXT).map(renderer.encode),
        st.sampled_from(list(call_texts) or ["x"]).map(renderer.encode),
        st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6),
        st.text(max_size=6).map(renderer.encode),
    )
    ids = [i for p in draw(st.lists(piece, max_size=5)) for i in p]
    stops = sorted(profile.stop_id_set)
    ending = draw(st.sampled_from(["close", "stop", "none"]))
    if ending == "close" and profile.close_id_set:
        ids.append(draw(st.sampled_from(sorted(profile.close_id_set))))
    elif ending == "stop" and stops:
        ids.append(draw(st.sampled_from(stops)))
    return ids
