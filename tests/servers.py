"""What the tests of the HTTP servers share (allocator/http.py and kubesim/apiserver.py)."""

from __future__ import annotations

from socketserver import BaseServer


def fail_requests(server: BaseServer, *errors: BaseException) -> None:
    """Each error as a request's handler raising it, from ports 40000, 40001, ...: socketserver calls
    `handle_error` inside the handler's `except`, and so does this."""
    for port, error in enumerate(errors, start=40000):
        try:
            raise error
        except BaseException:
            server.handle_error(None, ("127.0.0.1", port))
