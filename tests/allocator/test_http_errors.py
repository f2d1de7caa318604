"""The allocator's HTTP server reports a failed request through logging, not socketserver's stderr print."""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler

import pytest

from allocator.http import _Listener


def test_a_client_gone_mid_answer_is_a_debug_line_and_any_other_failure_a_logged_traceback(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # socketserver calls handle_error inside the handler's `except`: so does this test.
    listener = _Listener(("127.0.0.1", 0), BaseHTTPRequestHandler)
    try:
        with caplog.at_level(logging.DEBUG, logger="allocator.http"):
            try:
                raise BrokenPipeError(32, "Broken pipe")  # kube-scheduler's extender timeout, mid-answer
            except BrokenPipeError:
                listener.handle_error(None, ("127.0.0.1", 40000))
            try:
                raise ValueError("a bug in a handler")
            except ValueError:
                listener.handle_error(None, ("127.0.0.1", 40001))
    finally:
        listener.server_close()
    assert capsys.readouterr().err == ""  # socketserver's default printed both here
    gone, failed = caplog.records
    assert gone.levelno == logging.DEBUG and "went away before its answer" in gone.getMessage()
    assert (
        failed.levelno == logging.ERROR and failed.exc_info is not None and failed.exc_info[0] is ValueError
    )
