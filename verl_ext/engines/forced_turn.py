"""TEST/DEMO ONLY: teacher-force every trajectory's first assistant turn (a random model never calls a tool).

Both engines have the hook. The CPU engine (cpu.py, ``VERL_EXT_CPU_FORCE_FIRST_TURN``) generates the forced tokens
in its own loop. The SGLang server (sglang_server.py, ``VERL_EXT_SGLANG_FORCE_FIRST_TURN``) asks SGLang to *score*
them instead: one request whose input is the prompt followed by the forced ids, with the input-token logprobs from
the last prompt token on (SGLang returns ``None`` for the first entry: it has no context inside the scored span).
The answer is turned into what a generation of those ids would have returned, so the rest of the rollout (tool
call parsing, the tool result, later sampled turns, verl_ext's check) runs as for a sampled turn. The logprobs are
the model's at temperature 1 (SGLang's input logprobs are not temperature-scaled): run with temperature 1.

A request gets the forced ids when its prompt does not already contain them: a trajectory's first turn; every
later turn's prompt holds the forced turn. Never set the hook in a real run: that turn is not a sample of the
policy. This module does not import SGLang.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.core.errors import EngineRequestError

SGLANG_FORCE_ENV = "VERL_EXT_SGLANG_FORCE_FIRST_TURN"
# the demo's forced turn: a hermes calculator call, closed like a turn the model ended itself
FORCED_TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>'
# the VL demo's forced turn: a screenshot call, whose result holds an image (verl_ext/demo/screenshot_tool.py)
FORCED_SCREENSHOT_CALL = '<tool_call>\n{"name": "screenshot", "arguments": {"region": "top"}}\n</tool_call><|im_end|>'


def contains_subsequence(haystack: Sequence[int], needle: Sequence[int]) -> bool:
    """True when ``needle`` occurs contiguously in ``haystack``."""
    n = len(needle)
    if n == 0:
        return True
    first = needle[0]
    return any(haystack[i] == first and list(haystack[i : i + n]) == list(needle) for i in range(len(haystack) - n + 1))


def forced_prefix(prompt_ids: Sequence[int], force_ids: Sequence[int]) -> list[int]:
    """The ids to teacher-force for this request: all of them on a trajectory's first turn, which is any request
    whose prompt does not already contain them; none afterwards."""
    if not force_ids or contains_subsequence(prompt_ids, force_ids):
        return []
    return list(force_ids)


def scoring_request(request_id: str, prompt_ids: Sequence[int], forced: Sequence[int]) -> dict[str, Any]:
    """SGLang ``GenerateReqInput`` fields that score ``forced`` after ``prompt_ids`` (one sampled token, ignored)."""
    if not prompt_ids or not forced:
        raise EngineRequestError("forced first turn: a scoring request needs a prompt and ids to force")
    ids = [int(i) for i in prompt_ids] + [int(i) for i in forced]
    return {
        "rid": request_id,
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": len(prompt_ids) - 1,
    }


def forced_logprobs(output: Mapping[str, Any], forced: Sequence[int]) -> list[float]:
    """The logprob of each forced id from a scoring answer (``meta_info.input_token_logprobs``, entries
    ``(logprob, id, text)``): the last ``len(forced)`` entries, whose ids must be the forced ids."""
    entries = list((output.get("meta_info") or {}).get("input_token_logprobs") or [])
    tail = entries[len(entries) - len(forced) :] if len(entries) >= len(forced) else []
    if not tail:
        raise EngineRequestError(
            f"forced first turn: SGLang returned {len(entries)} input logprob entries for {len(forced)} forced ids "
            "(the scoring request sets logprob_start_len to the last prompt token)"
        )
    logprobs = []
    for position, (token_id, entry) in enumerate(zip(forced, tail, strict=True)):
        value, entry_id = entry[0], entry[1]
        if entry_id is None or int(entry_id) != int(token_id) or value is None or not math.isfinite(float(value)):
            raise EngineRequestError(
                f"forced first turn: input logprob entry {position} is {entry!r}, expected a finite logprob for id "
                f"{token_id}"
            )
        logprobs.append(float(value))
    return logprobs


def forced_generation(
    scored: Mapping[str, Any], prompt_len: int, forced: Sequence[int], max_new_tokens: int
) -> dict[str, Any]:
    """What SGLang would have returned had it generated ``forced`` (``{"output_ids", "meta_info"}``, cut to
    ``max_new_tokens``): a stop on the last forced id when it fits, else a length finish."""
    logprobs = forced_logprobs(scored, forced)
    kept = list(forced)[: max(0, max_new_tokens)]
    meta = scored.get("meta_info") or {}
    whole = bool(kept) and kept == list(forced)
    finish = {"type": "stop", "matched": int(kept[-1])} if whole else {"type": "length", "length": len(kept)}
    return {
        "output_ids": kept,
        "meta_info": {
            "id": meta.get("id"),
            "finish_reason": finish,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(kept),
            "cached_tokens": meta.get("cached_tokens"),
            "weight_version": meta.get("weight_version"),
            "output_token_logprobs": [(lp, int(i), None) for lp, i in zip(logprobs, kept, strict=False)],
        },
    }
