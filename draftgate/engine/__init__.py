"""The real inference engine (vLLM) in the loop: start it for a model directory, stop it whatever
happens (`launch`), and the embedded default's servable directory (`model`).

The engine runs in its own environment (`make engine` -> .venv-engine; engine/requirements.txt
says why it is separate), so draftgate never imports vllm: it starts the engine's OpenAI server
as a subprocess and talks HTTP to it. docs/engines.md records what the engine does differently.
"""
