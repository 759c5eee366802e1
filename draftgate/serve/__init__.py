"""Local serving: the embedded default target model behind an OpenAI-compatible API.

`model` loads/caches SmolLM2 and generates in batches; `local` is the HTTP server, `draftgate
serve`, and `running()` (a subprocess server for tests and pipelines); `scripted` is a
fault-injecting stand-in for client tests.
"""
