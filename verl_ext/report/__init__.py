"""The token-consistency report: record files in, one self-contained HTML page out (``verl-ext report``)."""

from verl_ext.report.build import Report, build_report, write_html

__all__ = ["Report", "build_report", "write_html"]
