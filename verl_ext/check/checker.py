"""Run the check on one rollout: engine view always, turn-end findings always, template view at a rate."""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.check.align import BudgetExceeded
from verl_ext.check.context_message import name_context_messages
from verl_ext.check.engine_view import check_engine_view
from verl_ext.check.findings import ENGINE_OUTPUT_FAILURES, Cause, CheckResult, FailureKind, Finding, Span
from verl_ext.check.image_view import expanding_images, rollout_image_view
from verl_ext.check.inputs import EngineCall, TrainerSample, engine_call_images
from verl_ext.check.locate import Locator
from verl_ext.check.lost_messages import lost_message_findings
from verl_ext.check.policy import CheckPolicy
from verl_ext.check.record import Rollout
from verl_ext.check.template_view import template_findings
from verl_ext.check.turn_boundaries import turn_end_findings
from verl_ext.check.version_view import version_findings
from verl_ext.core.errors import TemplateError
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import TemplateProfile

# When the stream itself is not the engine's, findings would describe the wrong tokens.
# Invalid engine output too: its turn was cut (or holds ids no template renders), so the locator's turns are off.
_BREAKS_ALIGNMENT = {FailureKind.LENGTH, FailureKind.RECORD, FailureKind.PREFIX, FailureKind.STREAM} | set(
    ENGINE_OUTPUT_FAILURES
)


class ConsistencyChecker:
    """Checks rollouts against their engine record and the chat template.

    ``renderer`` must carry the chat-template kwargs the rollout used (``with_template_kwargs``).
    """

    def __init__(
        self,
        renderer: ChatRenderer,
        profile: TemplateProfile | None = None,
        policy: CheckPolicy | None = None,
        seed: int = 0,
    ) -> None:
        self.renderer = renderer
        self.profile = profile or probe_template(renderer)
        self.policy = policy or CheckPolicy()
        self._rng = random.Random(seed)
        self._vocab_size = renderer.vocab_size  # read once: every rollout's engine view checks ids against it

    def check(
        self,
        calls: Sequence[EngineCall],
        sample: TrainerSample,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        repairs: Mapping[str, int] | None = None,
        template_view: bool | None = None,
        *,
        prompt_messages: int | None = None,
        response_length: int | None = None,
        template_clock: str | None = None,
    ) -> CheckResult:
        """``check_rollout(Rollout.of(calls, sample, messages, tools, ...))``: for callers that hold the parts of a
        rollout (tests, benchmarks, the replay round trip); the loop builds its ``Rollout`` once and passes that."""
        rollout = Rollout.of(
            calls,
            sample,
            messages,
            tools,
            prompt_messages=prompt_messages,
            response_length=response_length,
            repairs=repairs,
            template_clock=template_clock,
        )
        return self.check_rollout(rollout, template_view)

    def check_rollout(self, rollout: Rollout, template_view: bool | None = None) -> CheckResult:
        """Check one rollout: the engine view always, the turn-end findings when the engine view leaves the stream
        aligned, the template view at the policy's rate. Never raises for a rollout the template cannot render
        (a ``template_refused`` finding) or one whose template view runs out of time (``template_view_skipped``).

        ``template_view`` forces the template view on or off (default: the policy's rate). The rollout's
        ``prompt_messages`` is the number of messages in the first prompt (assistant messages in it are history,
        not engine output). Its ``response_length`` is the trainer's cap: a response shorter than the engine's
        stream is truncation only when it is exactly that long; without it, any shorter response is a cut. Its
        ``template_clock`` (the time the template's ``strftime_now`` read in the rollout) is the time re-rendered with.
        """
        calls, sample, messages, tools = rollout.calls, rollout.sample, rollout.messages, rollout.tools
        prompt_messages, response_length = rollout.prompt_messages, rollout.response_length
        started = time.perf_counter()
        ev = check_engine_view(
            calls,
            sample,
            self.policy.logprob_atol,
            response_length,
            vocab_size=self._vocab_size,
            stop_ids=self.profile.stop_id_set,
        )
        images = rollout_image_view(rollout.extra, sample, engine_call_images(calls))  # empty without images
        if images.failures:
            ev = dataclasses.replace(ev, failures=ev.failures + images.failures)
        findings: list[Finding] = []
        ran_template = False
        skipped = ""
        if not any(f.kind in _BREAKS_ALIGNMENT for f in ev.failures):
            stream = sample.stream  # a property that concatenates: read once
            stream = stream if len(stream) >= len(ev.engine_stream) else ev.engine_stream
            # The time the rollout's template read (today's date in its prompt), not the wall clock now.
            renderer = self.renderer.with_clock(rollout.template_clock) if rollout.template_clock else self.renderer
            renderer = expanding_images(renderer, rollout.extra)  # renders image blocks as the processor expanded them
            loc = Locator.build(calls, messages, stream, renderer, prompt_messages, rollout.assistants)
            findings = turn_end_findings(loc, self.profile, stream, self.policy.allows, messages)
            if template_view is None:
                rate = self.policy.template_view_rate
                template_view = rate >= 1.0 or (rate > 0.0 and self._rng.random() < rate)
            if template_view:
                findings, skipped = self._with_template_view(loc, renderer, messages, tools, findings)
                ran_template = not skipped
        versions, _counts = version_findings(calls, rollout.versions, self.policy.allows)
        findings += versions
        return CheckResult(
            engine_failures=ev.failures,
            findings=tuple(sorted(findings, key=lambda f: (f.stream.start, f.cause.value))),
            template_view=ran_template,
            truncated=ev.truncated,
            lost_sampled_tokens=ev.lost_sampled_tokens,
            num_turns=len(calls),
            num_sampled=rollout.num_sampled,
            repairs=Counter(rollout.repairs),
            seconds=time.perf_counter() - started,
            template_view_skipped=skipped,
            image_calls_unchecked=images.unchecked,
        )

    def _with_template_view(
        self,
        loc: Locator,
        renderer: ChatRenderer,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        findings: list[Finding],
    ) -> tuple[list[Finding], str]:
        """The turn-end ``findings`` merged with the template view's, and ""; or, when the template view ran out of
        its time budget, ``findings`` unchanged and why it stopped. Never raises for a template that refuses the
        final messages (a ``template_refused`` finding instead)."""
        explained = {i for f in findings for i in range(f.stream.start, f.stream.end)}
        budget = self.policy.template_view_budget_s
        view_started = time.perf_counter()
        try:
            rendered = template_findings(
                loc,
                self.profile,
                renderer,
                messages,
                tools,
                explained,
                self.policy.allows,
                deadline=None if budget is None else view_started + budget,
            )
        except TemplateError as exc:
            # Final messages the template refuses to render: nothing to compare with, say so.
            # A message the loop's messages lost makes them unrenderable on some templates: named from the calls.
            rendered = [self._refused(loc, exc), *lost_message_findings(loc, self.profile, self.policy.allows)]
        except BudgetExceeded as exc:
            # A long, divergent rollout must not stall the step: count it and say why, keep the rest.
            return findings, (
                f"over its {budget:g} s budget after {time.perf_counter() - view_started:.1f} s on "
                f"{len(loc.stream)} tokens: {exc} (raise verl_ext.check.template_view_budget_s)"
            )
        rendered = name_context_messages(rendered, loc, messages, self.policy.allows)
        # Where both views found the same thing, keep the template view's (it has both sides).
        located = {(f.cause, f.turn) for f in rendered}
        return [f for f in findings if (f.cause, f.turn) not in located] + rendered, ""

    def _refused(self, loc: Locator, exc: TemplateError) -> Finding:
        """The template refuses to render the final messages (two tool calls in one turn on a single-call
        template): there is no rendering to compare with, so the template view reports that instead of raising.
        Allowed by design: the engine view still proved the trainer's tokens are the engine's, and a rollout
        the template cannot express is not a divergence verl_ext could have repaired."""
        end = len(loc.stream)
        detail = f"the template view could not run: {exc}"
        return loc.finding(
            Cause.TEMPLATE_REFUSED, self.policy.allows(Cause.TEMPLATE_REFUSED), Span(end, end), Span(0, 0), (), detail
        )
