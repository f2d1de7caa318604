"""The allocator's HTTP server reports a failed request through logging, not socketserver's stderr print."""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler

import pytest

from allocator.http import _Listener
from tests.servers import fail_requests


def test_a_client_gone_mid_answer_is_a_debug_line_and_any_other_failure_a_logged_traceback(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    listener = _Listener(("127.0.0.1", 0), BaseHTTPRequestHandler)
    try:
        with caplog.at_level(logging.DEBUG, logger="allocator.http"):
            # kube-scheduler's extender timeout, mid-answer; then a bug in a handler
            fail_requests(listener, BrokenPipeError(32, "Broken pipe"), ValueError("a bug in a handler"))
    finally:
        listener.server_close()
    assert capsys.readouterr().err == ""  # socketserver's default printed both here
    gone, failed = caplog.records
    assert gone.levelno == logging.DEBUG and "went away before its answer" in gone.getMessage()
    assert (
        failed.levelno == logging.ERROR and failed.exc_info is not None and failed.exc_info[0] is ValueError
    )
