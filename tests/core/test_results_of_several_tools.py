"""Results of a turn that called several tools are appended as the template writes them.

verl_ext renders such results one call at a time where the template labels each result with a call's name
(GPT-OSS names every result after the turn's last call; verl_ext names each after its own, the check's allowed
``tool_result_labelled``). Everywhere else the template's own render of the results is what the engine sees: DeepSeek
R1 writes all results into one outputs block ("\\n" between them), firefunction writes its generation prompt after
every message whatever ``add_generation_prompt`` says; rendering them one call at a time wrote an outputs block per
result, or an assistant header between two results (the check found both, ``unknown``).
"""

from __future__ import annotations

import pytest
from call_reader_cases import PROMPT, TOOLS, assistant_message, case_renderer, rendered_turn

from verl_ext.core.probe import probe_template
from verl_ext.core.trajectory import TokenTrajectory

DRAWN = [("calculator", {"expression": "QXARGA"}), ("web_search", {"expression": "QXARGB"})]
# Templates that append results after a turn calling two tools (Llama 3.3 refuses two calls in one turn); GPT-OSS
# labels results by a call (and renders only a turn's first call).
CASES = {
    "templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": False,
    "templates/fireworks-ai-llama-3-firefunction-v2": False,
    "templates/deepseek-ai-DeepSeek-V3.1": False,
    "templates/moonshotai-Kimi-K2": False,
    "qwen3": False,
    "gpt-oss": True,
}


def _after_calls(text: str) -> str:
    return text[text.rfind("QXARG") :]


def _stream_and_render(case: str) -> tuple[str, str]:
    """The text after the turn's last call: as the trajectory appended the two results, and as the template renders
    the whole conversation."""
    r = case_renderer(case)
    profile = probe_template(r)
    message = assistant_message(profile, DRAWN)
    turn = rendered_turn(r, profile, message)
    assert turn is not None
    close = profile.boundary("tool").close_ids or (min(profile.close_id_set),)
    t = TokenTrajectory(r, profile)
    t.start([dict(m) for m in PROMPT], TOOLS)
    t.add_sampled([*r.encode(turn), close[0]], message=message)
    results = [
        {"role": "tool", "content": f"QXRESULT{k}", "tool_call_id": f"call{k + 1:05d}", "name": name}
        for k, (name, _) in enumerate(DRAWN)
    ]
    t.append_messages(results)
    render = r.render_text(profile.tool_call_shape.conform([*PROMPT, message, *results]), TOOLS, True)
    return _after_calls(r.decode(list(t.input_ids))), _after_calls(render)


@pytest.mark.parametrize("case", sorted(CASES))
def test_results_of_several_tools_are_the_templates_own(case: str) -> None:
    stream, render = _stream_and_render(case)
    if not CASES[case]:
        assert stream == render
        return
    # GPT-OSS: each result named after its own call, where the template names both after the last one
    assert stream != render
    assert _names_out(stream) == _names_out(render)
    assert stream.index("functions.calculator") < stream.index("QXRESULT0") < stream.index("functions.web_search")


def _names_out(text: str) -> str:
    for name, _ in DRAWN:
        text = text.replace(name, "NAME")
    return text
