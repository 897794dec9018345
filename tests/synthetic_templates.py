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
