"""A harness written against the official OpenAI SDK that sends images, as a screenshot agent does (nothing here knows
the gateway): the row's prompt with each image as an ``image_url`` data URL, a screenshot tool answered with the
row's ``screen`` image, then the model's answer."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

from openai import OpenAI
from vl_rollouts import TOOLS


def data_url(image: Any) -> str:
    """The image as a PNG data URL."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def openai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A verl dataset message (image parts hold the image itself) as an OpenAI chat message."""
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    parts = [
        {"type": "image_url", "image_url": {"url": data_url(p["image"])}} if p.get("type") == "image" else dict(p)
        for p in content
    ]
    return {**message, "content": parts}


def screenshot_agent(base_url: str, api_key: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """Ask; answer every screenshot call with the row's ``screen`` image (and a line of text); ask again."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [openai_message(m) for m in row["raw_prompt"]]
    reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=48)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or ():
        screen = {"type": "image_url", "image_url": {"url": data_url(row["screen"])}}
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": [screen, {"type": "text", "text": "the screen"}]}
        )
    answer = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=24)
    return {"calls": len(message.tool_calls or ()), "finish": answer.choices[0].finish_reason}
