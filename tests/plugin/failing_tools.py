"""Tools that fail on purpose, loaded by verl's function-tool loader in the agent-loop tests."""

import asyncio

from verl.tools.function_tool import function_tool


@function_tool
def explode(reason: str) -> str:
    """Always raises.

    Args:
        reason: why it should fail.
    """
    raise RuntimeError(f"exploded: {reason}")


@function_tool
async def sleepy(seconds: float) -> str:
    """Sleeps, then answers.

    Args:
        seconds: how long to sleep.
    """
    await asyncio.sleep(seconds)
    return "awake"
