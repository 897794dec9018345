"""What the gateway tests share: the scripted turns and the calculator tool (imported by name: a test module
named ``conftest`` would be ambiguous when several test folders run together)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Script:
    """Texts forced as assistant turns, by turn index (the number of assistant openings in the prompt, minus the
    generation prompt's); a turn with no text left is sampled freely."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.head = tokenizer.encode("<|im_start|>assistant", add_special_tokens=False)
        self.turns: list[str] = []
        self._ids: dict[str, list[int]] = {}

    def __call__(self, prompt: Sequence[int]) -> list[int]:
        n, h = 0, self.head
        for i in range(len(prompt) - len(h) + 1):
            if prompt[i] == h[0] and list(prompt[i : i + len(h)]) == h:
                n += 1
        turn = n - 1
        if turn >= len(self.turns):
            return []
        text = self.turns[turn]
        if text not in self._ids:
            self._ids[text] = self.tokenizer.encode(text, add_special_tokens=False)
        return self._ids[text]


CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "%s"}}\n</tool_call><|im_end|>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
