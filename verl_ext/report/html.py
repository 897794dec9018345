"""Render the report and the standalone audit page from the Jinja templates shipped in ``templates/``."""

from __future__ import annotations

from typing import Any

import jinja2

from verl_ext.report.plots import cause_color
from verl_ext.report.text import pieces, shorten


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("verl_ext.report", "templates"),
        autoescape=True,  # every record text is untrusted: tool output can hold HTML and special tokens
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pieces"] = pieces
    env.filters["shorten"] = shorten
    env.filters["cause_color"] = cause_color
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
