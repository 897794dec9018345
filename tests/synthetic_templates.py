"""Templates written for tests, for template shapes whose real tokenizer does not ship here."""

# GLM-shaped, over Qwen3's special tokens: assistant turns have no close, and a tool result opens with the
# token the model stops on (GLM's <|observation|>).
USER, ASSISTANT, OBSERVATION = "<|im_start|>", "<|object_ref_start|>", "<|im_end|>"
GLM_SHAPED = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}" + USER + "\n{{ m.content }}"
    "{%- elif m.role == 'assistant' -%}" + ASSISTANT + "\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] -%}<tool_call>{{ c.function.name }}{{ c.function.arguments | tojson }}"
    "</tool_call>{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}" + OBSERVATION + "\n{{ m.content }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}" + ASSISTANT + "{%- endif -%}"
)


def deepseek_r1_single_call_unclosed(distill_template: str) -> str:
    """DeepSeek R1's original template shape, from the R1-Distill fixture: the turn's closing markers
    ``<｜tool▁calls▁end｜><｜end▁of▁sentence｜>`` are written only in the branch for the second call on, so a turn
    with a single tool call has none (an upstream bug the Distill template fixed)."""
    close = "    {{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}\n"
    later_call = "'```' + '<｜tool▁call▁end｜>'}}\n      {%- endif -%}"
    assert distill_template.count(close) == 1 and distill_template.count(later_call) == 1
    return distill_template.replace(close, "").replace(
        later_call, "'```' + '<｜tool▁call▁end｜>'}}" + close.strip() + "\n      {%- endif -%}"
    )
