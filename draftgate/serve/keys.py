"""The local server's shared state, as aiohttp app keys: http.py's build_app sets them, the route
modules (chat, score) read them. A module of their own so the routes never import the app that
mounts them (no import cycle between http and its routes)."""

from __future__ import annotations

from aiohttp import web

from draftgate.serve.batcher import Batcher
from draftgate.serve.model import LocalModel
from draftgate.serve.protocol import CompletionIds

LM_KEY = web.AppKey("lm", LocalModel)
BATCHER_KEY = web.AppKey("batcher", Batcher)
IDS_KEY = web.AppKey("completion_ids", CompletionIds)
