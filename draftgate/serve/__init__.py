"""Local serving: the embedded default target model behind an OpenAI-compatible API.

`model` loads/caches SmolLM2 and generates in batches; `local` is `draftgate serve`, the HTTP
server built from `protocol` (requests, responses, completion ids), `batcher`, `http` (the app)
and its route modules (`chat`, `score`: they read the app's state through `keys`, never `http`);
`process.running()` runs it as a subprocess for stages and tests; `scripted` is a fault-injecting
stand-in for client tests.
"""
