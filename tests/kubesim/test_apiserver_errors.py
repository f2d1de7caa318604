"""kubesim's API server, like kube-apiserver, says nothing when a client resets a kept-alive connection, and
still prints what is a bug of its own."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest

from kubesim.apiserver import _Listener
from tests.servers import fail_requests


def test_a_client_that_resets_its_connection_is_not_reported_and_a_bug_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The reset is what a client closing its pool does to a connection the server waits on for the next
    # request line (tests/sparkgate/test_kube.py's dropped watches printed it in CI).
    listener = _Listener(("127.0.0.1", 0), BaseHTTPRequestHandler)
    try:
        fail_requests(listener, ConnectionResetError(104, "Connection reset by peer"))
        assert capsys.readouterr().err == ""
        fail_requests(listener, ValueError("a bug in a handler"))
    finally:
        listener.server_close()
    err = capsys.readouterr().err
    assert "Exception occurred during processing of request from ('127.0.0.1', 40000)" in err
    assert "ValueError: a bug in a handler" in err
