"""Secrets never shown (kb_retrieval/masking.py): a URL keeps its form but its password and secret parameters, and
log lines go through the same masking."""

from __future__ import annotations

import logging

import pytest

from kb_retrieval.masking import mask_secrets, mask_url


def test_log_lines_are_masked():
    from kb_retrieval.log_format import _MaskingFormatter

    record = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "cannot reach %s", ("http://root:PW-77@db:19530",), None
    )
    # One style with the CLI's own messages (issue 41): "error: ..." / "warning: ...".
    assert _MaskingFormatter().format(record) == "error: cannot reach http://root:***@db:19530"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("sqlite:///.kb-state/demo/traces.db", "sqlite:///.kb-state/demo/traces.db"),  # relative: three slashes
        ("sqlite:////var/lib/kb/traces.db", "sqlite:////var/lib/kb/traces.db"),  # absolute: four
        ("sqlite:///t.db?password=PW-1", "sqlite:///t.db?password=***"),
        ("sqlite://", "sqlite://"),
        ("http://root:PW-2@db:19530", "http://root:***@db:19530"),
    ],
)
def test_masking_keeps_the_url_as_written_but_its_secrets(url, shown):
    assert mask_url(url) == shown
    assert mask_secrets(f"rows in {url} (x)") == f"rows in {shown} (x)"
