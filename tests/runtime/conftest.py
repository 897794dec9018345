"""The runtime tests drive every caller of the rollout runtime: the agent-loop harness (tests/plugin) and the
gateway's scripted turns and SDK harnesses (tests/gateway) are imported by name from their folders."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for folder in ("plugin", "gateway"):
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))
