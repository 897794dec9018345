"""Random rollouts for property tests: random conversations, random sampled ids, every shipped family."""

from __future__ import annotations

from hypothesis import strategies as st

FAMILIES = ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3")
TEXT = st.lists(
    st.sampled_from([*'ab c{}"\n  é中🙂<|>/', "<|im_end|>", "</s>", "<|end|>", "<tool_call>"]), max_size=12
).map("".join)


@st.composite
def rollouts(draw, vocab_size: int, special_ids: list[int]):
    """(turns, finish reasons, appended roles): sampled ids mix text ids, special ids and empty turns."""
    n_turns = draw(st.integers(1, 4))
    token = st.one_of(st.integers(0, vocab_size - 1), st.sampled_from(special_ids))
    turns = [draw(st.lists(token, max_size=12)) for _ in range(n_turns)]
    finishes = [draw(st.sampled_from(["stop", "length"])) for _ in range(n_turns)]
    appends = [draw(st.sampled_from(["tool", "tool2", "user"])) for _ in range(n_turns - 1)]
    texts = [draw(TEXT) for _ in range(n_turns * 2)]
    return turns, finishes, appends, texts


CALL = {"id": "call00001", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "1"}}}


def appended_messages(kind: str, texts: list[str]) -> tuple[list[dict], dict]:
    tool = {"role": "tool", "tool_call_id": "call00001", "name": "calculator"}
    if kind == "tool":
        return [{**tool, "content": texts[0]}], {"role": "assistant", "content": "", "tool_calls": [CALL]}
    if kind == "tool2":
        calls = [CALL, {**CALL, "id": "call00002"}]
        msgs = [{**tool, "content": texts[0]}, {**tool, "content": texts[1], "tool_call_id": "call00002"}]
        return msgs, {"role": "assistant", "content": "", "tool_calls": calls}
    return [{"role": "user", "content": texts[0] or "ok"}], {"role": "assistant", "content": "x"}
