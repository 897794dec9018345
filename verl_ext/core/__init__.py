"""The token core: template-derived turn boundaries and the append-only token trajectory.

Nothing here imports verl, Ray or torch: only a Hugging Face tokenizer and its chat template.
"""

from verl_ext.core.errors import (
    EngineRequestError,
    MissingFileError,
    OptionsError,
    TemplateError,
    TrajectoryError,
    VerlExtError,
)
from verl_ext.core.invariants import InvariantReport, check_invariants
from verl_ext.core.probe import probe_template
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.rendering import ChatRenderer, Escape, load_renderer
from verl_ext.core.template_profile import TemplateProfile, Verdict
from verl_ext.core.trajectory import FinishReason, RepairKind, TokenKind, TokenTrajectory

__all__ = [
    "ChatRenderer",
    "EngineRequestError",
    "Escape",
    "FinishReason",
    "InvariantReport",
    "MissingFileError",
    "OptionsError",
    "PromptIds",
    "RepairKind",
    "TemplateError",
    "TemplateProfile",
    "TokenKind",
    "TokenTrajectory",
    "TrajectoryError",
    "Verdict",
    "VerlExtError",
    "check_invariants",
    "load_renderer",
    "probe_template",
]
