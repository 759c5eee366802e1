"""The aiohttp-backed httpx transport: a real httpx transport, httpx errors, no key in sight."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from draftgate.client.http import AiohttpTransport, ChatClient
from draftgate.serve.scripted import Script, running


def test_it_plugs_into_httpx_async_client_and_keeps_connections_alive():
    async def go(base_url: str) -> list[dict]:
        async with httpx.AsyncClient(transport=AiohttpTransport(8), base_url=base_url) as client:
            rs = await asyncio.gather(*(client.post("/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": f"k{i}"}]}) for i in range(20)))
        return [r.json() for r in rs]

    with running(Script()) as server:
        answers = asyncio.run(go(server.base_url))
        assert server.connections <= 8
    assert [a["choices"][0]["message"]["content"] for a in answers] == [f"Answer to k{i}." for i in range(20)]


def test_a_refused_connection_is_an_httpx_connect_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # bound, never listening: connections are refused

        async def go():
            client = ChatClient(f"http://127.0.0.1:{port}/v1", None, 4)
            try:
                await client.post(b"{}")
            finally:
                await client.aclose()

        with pytest.raises(httpx.ConnectError):
            asyncio.run(go())


def test_the_key_is_sent_as_a_bearer_header_and_never_shown():
    client = ChatClient("http://127.0.0.1:1/v1", "sk-or-v1-hidden", 4)
    assert "hidden" not in repr(client)
    with running(Script(api_key="sk-or-v1-hidden")) as server:
        async def go():
            c = ChatClient(server.base_url, "sk-or-v1-hidden", 4)
            try:
                return await c.post(b'{"model":"m","messages":[{"role":"user","content":"x"}]}')
            finally:
                await c.aclose()
        assert asyncio.run(go()).status_code == 200
