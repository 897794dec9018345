"""A record file's first line, typed: ``RecordHeader`` holds the template profile its rollouts were checked against,
and ``HeaderProfile`` (with ``ProfileStop``, ``ProfileBoundary``, ``ProfileReason``) the profile's keys the report
displays. Every key is type-checked on read (``record_json.JsonFields``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl_ext.check.record_json import JsonFields, json_objects, plain_json, read_version

if TYPE_CHECKING:
    from verl_ext.core.template_profile import TemplateProfile


@dataclass(frozen=True)
class ProfileStop:
    """One stop id of a header's profile (``core.template_profile.StopId`` as the record holds it)."""

    id: int
    text: str
    sources: tuple[str, ...]


@dataclass(frozen=True)
class ProfileBoundary:
    """One boundary of a header's profile (``core.template_profile.Boundary`` as the record holds it)."""

    next_role: str
    close_ids: tuple[int, ...]
    trailer_ids: tuple[int, ...]
    delta_ids: tuple[int, ...]
    prefix_preserving: bool
    divergence: str


@dataclass(frozen=True)
class ProfileReason:
    severity: str
    text: str


@dataclass(frozen=True)
class HeaderProfile:
    """The template profile of a record header, typed: the keys of ``TemplateProfile.to_dict`` the report displays.
    A key the file lacks (a profile from an older verl_ext, or ``{}``) takes its default; ``None`` for the two
    ``bool | None`` facts means what the probe meant by it (not renderable / never rendered)."""

    fingerprint: str = ""
    tokenizer_name: str = ""
    tokenizer_fingerprint: str = ""  # the tokenizer alone (headers from before it was written: "")
    verdict: str = "?"
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    stop_ids: tuple[ProfileStop, ...] = ()
    alias_stop_ids: tuple[int, ...] = ()
    generation_prompt_ids: tuple[int, ...] = ()
    boundaries: tuple[ProfileBoundary, ...] = ()
    unsupported_roles: Mapping[str, str] = field(default_factory=dict)
    strips_reasoning: bool | None = None
    consecutive_tool_results_grouped: bool | None = None
    tool_call_arguments: str = "?"
    reasons: tuple[ProfileReason, ...] = ()

    @classmethod
    def of(cls, profile: TemplateProfile) -> HeaderProfile:
        """The typed form of a profile the probe just derived (``verl-ext check-template --html``)."""
        return cls.from_json(plain_json(profile.to_dict()), "template profile")

    @classmethod
    def from_json(cls, obj: Any, where: str = "header", path: str = "template_profile") -> HeaderProfile:
        """Raises RecordError naming ``where`` and the key (``template_profile.boundaries[0].close_ids``) for a
        value of the wrong type."""
        f = JsonFields(obj, where, path)
        roles = JsonFields(f.dict("unsupported_roles", default={}), where, f"{path}.unsupported_roles")
        return cls(
            fingerprint=f.str("fingerprint", default=""),
            tokenizer_name=f.str("tokenizer_name", default=""),
            tokenizer_fingerprint=f.str("tokenizer_fingerprint", default=""),
            verdict=f.str("verdict", default="?"),
            template_kwargs=f.dict("template_kwargs", default={}),
            stop_ids=tuple(
                ProfileStop(s.int("id"), s.str("text", default=""), s.strs("sources", default=()))
                for s in json_objects(f, "stop_ids")
            ),
            alias_stop_ids=f.ints("alias_stop_ids", default=()),
            generation_prompt_ids=f.ints("generation_prompt_ids", default=()),
            boundaries=tuple(
                ProfileBoundary(
                    next_role=b.str("next_role", default=""),
                    close_ids=b.ints("close_ids", default=()),
                    trailer_ids=b.ints("trailer_ids", default=()),
                    delta_ids=b.ints("delta_ids", default=()),
                    prefix_preserving=b.bool("prefix_preserving", default=False),
                    divergence=b.str("divergence", default=""),
                )
                for b in json_objects(f, "boundaries")
            ),
            unsupported_roles={k: roles.str(k) for k in roles.obj},
            strips_reasoning=f.bool("strips_reasoning", default=None),
            consecutive_tool_results_grouped=f.bool("consecutive_tool_results_grouped", default=None),
            tool_call_arguments=f.str("tool_call_arguments", default="?"),
            reasons=tuple(
                ProfileReason(r.str("severity", default=""), r.str("text", default=""))
                for r in json_objects(f, "reasons")
            ),
        )


@dataclass(frozen=True)
class RecordHeader:
    """A record file's first line: the template profile (``TemplateProfile.to_dict``) its rollouts were checked
    against. ``template_profile`` is the JSON object the probe wrote (written back unchanged); ``profile`` is its
    typed form, which the report's audit (``report/audit.py``) displays. Raises RecordError (naming "header") when
    the profile has a key of the wrong type."""

    version: int
    template_profile: Mapping[str, Any]
    profile: HeaderProfile = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.profile is None:
            object.__setattr__(self, "profile", HeaderProfile.from_json(plain_json(self.template_profile)))

    @property
    def fingerprint(self) -> str:
        return self.profile.fingerprint

    @classmethod
    def from_json(cls, obj: Any, where: str = "header") -> RecordHeader:
        """Raises RecordError naming ``where`` for a wrong type (in the profile too) or a schema version newer than
        this verl_ext reads."""
        f = JsonFields(obj, where, "")
        version = read_version(f, where)
        f.only(("type", "version", "template_profile"), "a record header")
        raw = f.dict("template_profile", default={})
        return cls(version, raw, HeaderProfile.from_json(raw, where))

    def to_json(self) -> dict[str, Any]:
        return {"type": "header", "version": self.version, "template_profile": dict(self.template_profile)}
