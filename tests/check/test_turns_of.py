"""``turns_of``: the engine call of every stream position, built per call, equals ``turn_at`` asked position by
position."""

from __future__ import annotations

import random

from verl_ext.check.engine_view import turn_at
from verl_ext.check.record import RecordedCall, turns_of


def test_turns_of_equals_turn_at_at_every_position() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(0, 60)
        starts = sorted(rng.randint(0, n + 5) for _ in range(rng.randint(0, 6)))  # ties and starts past n included
        calls = [RecordedCall(s, (1,) * rng.randint(0, 3), None, "stop") for s in starts]
        if rng.random() < 0.1:
            rng.shuffle(calls)  # a broken record: out of order
        assert turns_of(calls, n) == tuple(turn_at(calls, p) for p in range(n))  # no call: 0 everywhere
