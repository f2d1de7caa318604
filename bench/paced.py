"""An open-loop HTTPS load generator at a fixed offered rate (wrk2 is not packaged; hey's -q is closed-loop).

Request i is due at start + i / rate whatever happened to the earlier ones, and its latency is counted from
that due time to the last byte of the answer, so a stall shows up in the latency of every request it delayed
(no coordinated omission). With keep-alive, idle connections are reused most-recently-used first and a new
one is opened only when none is idle, as Go's http.Transport (the API server's webhook client) does; without
it, every request opens a TLS connection of its own and sends `Connection: close`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class PacedResult:
    offered_rate: float
    sent: int
    latencies: list[float] = field(default_factory=list)  # seconds, due time -> answer read
    errors: int = 0
    connections_opened: int = 0
    elapsed: float = 0.0

    @property
    def achieved_rate(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


class PacedClient:
    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        bodies: list[bytes],
        context: ssl.SSLContext,
        *,
        keepalive: bool = True,
        timeout: float = 10.0,
    ) -> None:
        self.host, self.port = host, port
        self.context = context
        self.keepalive = keepalive
        self.timeout = timeout
        close = b"" if keepalive else b"Connection: close\r\n"
        self.requests = [
            b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path.encode(), host.encode(), port, len(body), close, body)
            for body in bodies
        ]
        self.idle: list[Connection] = []
        self.opened = 0

    async def _connect(self) -> Connection:
        self.opened += 1
        return await asyncio.open_connection(self.host, self.port, ssl=self.context)

    async def _exchange(self, connection: Connection, data: bytes) -> bool:
        """Send one request and read its answer; True when the connection may be reused."""
        reader, writer = connection
        writer.write(data)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
        }
        await reader.readexactly(int(headers.get("content-length", "0")))
        if status != 200:
            raise RuntimeError(f"HTTP {status}")
        return headers.get("connection", "").lower() != "close"

    async def one(self, data: bytes) -> None:
        connection = self.idle.pop() if self.keepalive and self.idle else await self._connect()
        reusable = False
        try:
            reusable = await asyncio.wait_for(self._exchange(connection, data), self.timeout)
        finally:
            if self.keepalive and reusable:
                self.idle.append(connection)
            else:
                _close(connection)

    async def warm_up(self, n: int) -> None:
        for i in range(n):
            await self.one(self.requests[i % len(self.requests)])

    async def run(self, rate: float, duration: float) -> PacedResult:
        loop = asyncio.get_running_loop()
        total = max(1, int(rate * duration))
        result = PacedResult(offered_rate=rate, sent=total)
        opened_before = self.opened

        async def request(i: int, due: float) -> None:
            try:
                await self.one(self.requests[i % len(self.requests)])
            except (OSError, RuntimeError, ValueError, IndexError, asyncio.IncompleteReadError, TimeoutError):
                result.errors += 1
                return
            result.latencies.append(loop.time() - due)

        tasks = []
        start = loop.time() + 0.01
        for i in range(total):
            due = start + i / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(request(i, due)))
        await asyncio.gather(*tasks)
        result.elapsed = loop.time() - start
        result.connections_opened = self.opened - opened_before
        return result

    async def close(self) -> None:
        while self.idle:
            _close(self.idle.pop())


def _close(connection: Connection) -> None:
    """Close at once, as Go's tls.Conn.Close does: asyncio's own close() sends close_notify and then holds the
    TCP connection open until the server's close_notify (up to 30 s), which gunicorn never sends: it half-closes
    and drains the socket on its worker's main thread (gunicorn.util.close_graceful, up to 2 s per
    connection), so that client stalls the whole worker and is not what the API server does."""
    connection[1].transport.abort()


def paced(
    host: str,
    port: int,
    path: str,
    bodies: list[bytes],
    context: ssl.SSLContext,
    *,
    rate: float,
    duration: float,
    keepalive: bool,
    warm_up: int = 20,
) -> PacedResult:
    """Offer `rate` requests/s for `duration` seconds (after `warm_up` sequential requests, not counted)."""

    async def go() -> PacedResult:
        client = PacedClient(host, port, path, bodies, context, keepalive=keepalive)
        try:
            await client.warm_up(warm_up)
            return await client.run(rate, duration)
        finally:
            await client.close()

    started = time.perf_counter()
    result = asyncio.run(go())
    if not result.elapsed:
        result.elapsed = time.perf_counter() - started
    return result
