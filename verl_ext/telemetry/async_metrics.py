"""Per-rollout counters and per-step figures of policy versions under async trainers: ``tito/async/*``.

A rollout's counters (``version_counters``) are summed per step by the metrics sink like every loop counter; the
step's figures that are ratios of sums are derived once per step (``async_ratios``):

- ``tito/async/turns``, ``tito/async/mixed_turns`` (turns whose tokens came from more than one version) and
  ``tito/async/mixed_turn_share``; ``tito/async/resumes`` and ``tito/async/resumes_per_turn``
- ``tito/async/versioned_tokens`` (output tokens with a known version), ``tito/async/lag_token_sum`` and
  ``tito/async/staleness_mean`` (token-weighted: versions between a token's policy and the trained step's, 0 for
  an on-policy token, read with the trainer's sync convention the record keeps: ``RolloutVersions.lag``),
  ``tito/async/tokens_lag_0`` ... ``tito/async/tokens_lag_3plus``
- ``tito/async/unstamped_tokens``: output tokens whose engine stamped no dispatch version (or without a lag: no
  trained step);
  ``tito/async/unverified_resumes``: resumes whose engine reported no prompt CRC (their prompt is not checked)
- ``tito/async/ids_cut``: ids the id check cut before a resume (regenerated)
- ``tito/async/masked_stale_tokens``: tokens the opt-in ``verl_ext.max_token_lag`` masked out (loss mask 0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, MutableMapping

from verl_ext.core.version_spans import RolloutVersions, mixes_versions

ASYNC = "async/"
LAG_BUCKETS = 3  # tokens_lag_0 .. tokens_lag_2, then tokens_lag_3plus
_ALWAYS = (
    "turns",
    "mixed_turns",
    "resumes",
    "unverified_resumes",
    "ids_cut",
    "versioned_tokens",
    "lag_token_sum",
    "unstamped_tokens",
    "masked_stale_tokens",
    *(f"tokens_lag_{k}" for k in range(LAG_BUCKETS)),
    f"tokens_lag_{LAG_BUCKETS}plus",
)


def version_counters(versions: RolloutVersions | None, masked: int = 0) -> Counter[str]:
    """The rollout's ``async/`` counters (empty for a rollout without versions)."""
    c: Counter[str] = Counter()
    if versions is None:
        return c
    for key in _ALWAYS:  # present at 0 too: a tracker draws continuous lines
        c[f"{ASYNC}{key}"] = 0
    for call, call_spans in zip(versions.calls, versions.spans(), strict=True):
        c[f"{ASYNC}turns"] += 1
        c[f"{ASYNC}mixed_turns"] += mixes_versions(call_spans)
        c[f"{ASYNC}resumes"] += max(0, len(call) - 1)
        c[f"{ASYNC}unverified_resumes"] += sum(a.prompt_crc is None for a in call[1:])
        c[f"{ASYNC}ids_cut"] += sum(a.ids_cut for a in call)
        for s in call_spans:
            lag = None if s.version is None else versions.lag(s.version)
            if lag is None:
                c[f"{ASYNC}unstamped_tokens"] += s.tokens
                continue
            c[f"{ASYNC}versioned_tokens"] += s.tokens
            c[f"{ASYNC}lag_token_sum"] += lag * s.tokens
            bucket = str(lag) if 0 <= lag < LAG_BUCKETS else f"{LAG_BUCKETS}plus" if lag >= 0 else "negative"
            c[f"{ASYNC}tokens_lag_{bucket}"] += s.tokens
    c[f"{ASYNC}masked_stale_tokens"] += masked
    return c


def async_ratios(metrics: MutableMapping[str, float], prefix: str) -> None:
    """Add the step's ratios (``staleness_mean``, ``mixed_turn_share``, ``resumes_per_turn``) to ``metrics``, the
    step's summed counters under ``prefix`` (``tito/``), where any turn carried versions."""
    get: Mapping[str, float] = metrics
    turns = get.get(f"{prefix}{ASYNC}turns", 0.0)
    if not turns:
        return
    tokens = get.get(f"{prefix}{ASYNC}versioned_tokens", 0.0)
    metrics[f"{prefix}{ASYNC}staleness_mean"] = (
        get.get(f"{prefix}{ASYNC}lag_token_sum", 0.0) / tokens if tokens else 0.0
    )
    metrics[f"{prefix}{ASYNC}mixed_turn_share"] = get.get(f"{prefix}{ASYNC}mixed_turns", 0.0) / turns
    metrics[f"{prefix}{ASYNC}resumes_per_turn"] = get.get(f"{prefix}{ASYNC}resumes", 0.0) / turns
