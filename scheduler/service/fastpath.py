"""The request path made short, measured with ``benchmarks/slots.py`` (100 concurrent clients on 2 cores): what is
left is the decision itself and its commit.

- :class:`Routes`: the REST operations found by one dict lookup on (method, number of path segments), then a
  comparison of the fixed segments, before Starlette's middleware and router (whose route scan, exception wrappers
  and per-request objects cost more than the service's decision). Whatever does not match exactly (MCP, an unknown
  path, another method, ``HEAD``) goes on to the Starlette app, which answers as before.
- :class:`Corked`: a response's head and body leave in one ``send`` instead of two, as soon as the body is written.
  On loopback the kernel's work for a send (waking the reader) was the largest single cost of a call in the
  profile.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

log = logging.getLogger("gpupack.service")


class Routes:
    """An ASGI app answering the declared REST operations directly; ``table``: (method, path template, handler)
    where a handler takes a Starlette ``Request`` and returns a ``Response``; anything else goes to ``fallback``."""

    def __init__(self, table: list[tuple[str, str, Callable]], fallback, crash: Callable):
        self.fallback, self.crash = fallback, crash
        self.index: dict[tuple[str, int], list[tuple[list[str | None], list[str], Callable]]] = {}
        for method, path, handler in table:
            parts = path.strip("/").split("/")
            fixed = [None if p.startswith("{") else p for p in parts]
            names = [p[1:-1] for p in parts if p.startswith("{")]
            self.index.setdefault((method, len(parts)), []).append((fixed, names, handler))

    def match(self, method: str, path: str) -> tuple[Callable, dict] | None:
        parts = path.strip("/").split("/") if path.startswith("/") and not path.endswith("/") else None
        if parts is None:
            return None
        for fixed, names, handler in self.index.get((method, len(parts)), ()):
            if all(f is None or f == p for f, p in zip(fixed, parts)) and all(p for p in parts):
                params = [p for f, p in zip(fixed, parts) if f is None]
                return handler, dict(zip(names, params))
        return None

    async def __call__(self, scope, receive, send):
        found = self.match(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if found is None:
            return await self.fallback(scope, receive, send)
        from starlette.requests import Request

        handler, params = found
        scope["path_params"] = params
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except Exception as e:  # a fault of the program: JSON 500, and its traceback in the log
            log.exception("%s %s failed", scope["method"], scope["path"])
            response = await self.crash(request, e)
        await response(scope, receive, send)


class Answer:
    """A JSON answer as its two ASGI messages, with the two headers it needs (a Starlette ``JSONResponse`` builds a
    header object and more for each answer)."""

    __slots__ = ("body", "status_code")

    def __init__(self, content: Any, status: int = 200):
        from scheduler.service.validate import render

        self.body, self.status_code = render(content), status

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": [(b"content-length", b"%d" % len(self.body)), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": self.body})


class Corked:
    """A transport that holds a response's head until its body is written, and sends the two in one ``send``; a
    head without a body (or anything else held) leaves at the end of the event loop's turn. With a ``group``
    (:class:`scheduler.service.groupcommit.GroupCommit`), whatever is written while decisions are uncommitted waits
    for their commit."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, group=None):
        self._transport, self._loop, self._group = transport, loop, group
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
            self._send(data)
        elif data.startswith(b"HTTP/1.1 ") and data.endswith(b"\r\n\r\n"):  # a head: its body comes next
            self._held = data
            self._loop.call_soon(self._flush)
        else:
            self._send(data)

    def _send(self, data: bytes) -> None:
        if self._group is None or not self._group.hold(self._transport, data):
            self._transport.write(data)

    def _flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._send(data)

    def close(self) -> None:
        self._flush()
        if self._group is not None and self._group.held:  # the answer waits for the commit: close after it
            self._loop.call_soon(self._transport.close)
            return
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def protocol_class(group=None):
    """uvicorn's httptools protocol on a :class:`Corked` transport, its decisions grouped by ``group`` (a
    :class:`~scheduler.service.groupcommit.GroupCommit`, bound to the server's loop by the first connection); None
    when httptools is missing (uvicorn's own protocol then)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class CorkedHttpTools(HttpToolsProtocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            if group is not None:
                group.bind(self.loop)
            super().connection_made(Corked(transport, self.loop, group))

    return CorkedHttpTools
