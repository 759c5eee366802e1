"""HTTP for thousands of requests in flight: an httpx transport over one aiohttp connection pool.

Measured here (2 cores shared with other work, scripted server answering in 0-0.2 s, 2,000 in
flight, 6,000 requests): httpx's own pool ~55 req/s (docs/openrouter.md); `httpx.AsyncClient` over
`httpx_aiohttp.AiohttpTransport` ~1,100; that transport called directly ~2,300; bare aiohttp ~0.33 ms
CPU a request. So requests and responses are real `httpx.Request` / `httpx.Response` objects and
`AiohttpTransport` plugs into `httpx.AsyncClient(transport=...)`, but the hot path
(`ChatClient.post`) calls the transport directly: AsyncClient's per-request machinery (auth flow,
cookies, event hooks, URL merging) costs half the throughput. With journal, parsing and retries
the whole client spends ~0.39 ms CPU a request against bare aiohttp's ~0.36 (bench/client.py).
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import aiohttp
import httpx


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_connections: int = 100, keepalive_s: float = 30.0):
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # auto_decompress off: httpx.Response decodes Content-Encoding itself.
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                         keepalive_timeout=self.keepalive_s)
        return aiohttp.ClientSession(connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._session is None:
            self._session = self._open()
        try:
            async with self._session.request(
                request.method, str(request.url), data=await request.aread() or None,
                # .raw, not .multi_items(): the latter re-derives the charset per header (~20% of CPU).
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw],
                allow_redirects=False,
            ) as resp:
                content = await resp.read()
        except aiohttp.ClientError as e:
            raise _as_httpx(e, request) from e
        return httpx.Response(resp.status, headers=resp.raw_headers, content=content, request=request)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _as_httpx(e: aiohttp.ClientError, request: httpx.Request) -> httpx.TransportError:
    msg = f"{type(e).__name__}: {e}"
    if isinstance(e, (aiohttp.ConnectionTimeoutError,)):
        return httpx.ConnectTimeout(msg, request=request)
    if isinstance(e, (aiohttp.ServerTimeoutError, aiohttp.SocketTimeoutError)):
        return httpx.ReadTimeout(msg, request=request)
    if isinstance(e, aiohttp.ClientConnectorError):
        return httpx.ConnectError(msg, request=request)
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return httpx.RemoteProtocolError(msg, request=request)
    if isinstance(e, (aiohttp.InvalidUrlClientError, aiohttp.NonHttpUrlClientError)):
        return httpx.UnsupportedProtocol(msg, request=request)
    return httpx.ReadError(msg, request=request)


class ChatClient:
    """POSTs prebuilt JSON bodies to {base_url}/chat/completions; the key lives only in a header."""

    def __init__(self, base_url: str, api_key: str | None, max_connections: int,
                 extra_headers: dict[str, str] | None = None):
        self.url = httpx.URL(base_url.rstrip("/") + "/chat/completions")
        headers: dict[str, Any] = {"Content-Type": "application/json", "Accept": "application/json",
                                   "Accept-Encoding": "gzip, deflate", **(extra_headers or {})}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # Host and Content-Length given up front and the body as a ByteStream: httpx.Request then
        # skips its header defaulting passes (~25 -> ~8 us a request, measured).
        self._headers = [(b"Host", self.url.netloc)] + [(k.encode(), v.encode()) for k, v in headers.items()]
        self.transport = AiohttpTransport(max_connections)
        raise_open_files_limit(max_connections * 2 + 256)

    def __repr__(self) -> str:   # never show the Authorization header
        return f"ChatClient({str(self.url)!r})"

    async def post(self, body: bytes) -> httpx.Response:
        request = httpx.Request("POST", self.url, headers=self._headers + [(b"Content-Length", b"%d" % len(body))],
                                stream=httpx.ByteStream(body))
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self.transport.aclose()


def raise_open_files_limit(want: int) -> None:
    """Thousands of sockets need thousands of descriptors; the soft limit is often 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < want:
            print(f"draftgate: open-files limit {new} < {want} needed for this concurrency; "
                  "lower generate.concurrency or raise `ulimit -n`", file=sys.stderr)
