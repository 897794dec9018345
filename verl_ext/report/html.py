"""Render the report and the standalone audit page from the Jinja templates shipped in ``templates/``."""

from __future__ import annotations

import re
from typing import Any

import jinja2

from verl_ext.report.plots import cause_color
from verl_ext.report.text import pieces, shorten


def environment() -> jinja2.Environment:
    """The report's Jinja environment: its templates, autoescape on, undefined names an error."""
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
    env.filters["css_name"] = css_name
    env.filters["ids"] = short_ids
    return env


def css_name(value: object) -> str:
    """A record value (a cause name, a step) as a class-name fragment: letters, digits, - and _ only."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(value))


def short_ids(ids: list[int], limit: int = 24) -> str:
    """Token ids for display; a long list keeps both ends (a 100k-token span must not print 100k ids)."""
    if len(ids) <= limit:
        return " ".join(str(i) for i in ids)
    half = limit // 2
    head, tail = " ".join(map(str, ids[:half])), " ".join(map(str, ids[-half:]))
    return f"{head} … ({len(ids) - limit} more) … {tail}"


def render(template: str, **context: Any) -> str:
    """One template of the report rendered with ``context``."""
    return environment().get_template(template).render(**context)
