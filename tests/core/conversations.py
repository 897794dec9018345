"""Conversation pieces shared by the core tests."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": []},
        },
    }
]
CALL = {"id": "call00001", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}}
