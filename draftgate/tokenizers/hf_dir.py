"""The hf_dir kind: any HF tokenizer directory, a tiktoken one behind remote code included.

A directory with a fast tokenizer loads as it is. A Python tokenizer around a tiktoken Encoding
(Kimi-K2) is rebuilt as a fast one from that Encoding's own ranks, regex and special tokens, then
cross-checked against it on probe texts. Nothing is fetched from a hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftgate.tokenizers.base import Tokenizer, TokenizerError
from draftgate.tokenizers.ranks import build_from_ranks

# Diverse text for cross-checking two encoders of one vocabulary at load time (a converted
# tiktoken tokenizer against its own tiktoken core). The tests fuzz far more.
PROBE_TEXTS = (
    "Hello, world! The answer is 42.\n\nThe end.", "foo bar  baz\t\tqux\r\n\r\nx = (1, 2))",
    "def f(x):\n    return x ** 2  # square\n", "12345 67.890 1e-9 0x1F", "  leading and trailing  ",
    "naïve café Ångström", "na\u0308ive cafe\u0301", "日本語のテキストと中文混合 text", "한국어 문장입니다.",
    "Ελληνικά и русский", "emoji 🤖👩🏽‍💻 done", "I'm we'll they'd YOU'RE", "\n\n\n", "   \n  \n",
    "<|im_end|> is text here", "<think>not a tag</think>", "a" * 300, " " * 40 + "x",
    "{\"name\": \"add\", \"arguments\": {\"a\": 1}}", "ＡＢＣ　全角", "\u200bzero\u200dwidth",
)


def load_hf_dir(path: str | None, *, trust_remote_code: bool) -> Tokenizer:
    if not path:
        raise TokenizerError("tokenizer.kind is hf_dir but tokenizer.path is not set; point it at "
                             "a directory with tokenizer.json (or tokenizer_config.json + remote code)")
    d = Path(path)
    if not d.is_dir():
        raise TokenizerError(f"tokenizer.path {str(d)!r} is not a directory; give the folder that "
                             "holds tokenizer.json / tokenizer_config.json (download it beforehand: "
                             "nothing is fetched from a hub)")
    if not (d / "tokenizer.json").is_file() and (d / "tiktoken.model").is_file() and not trust_remote_code:
        # transformers would convert tiktoken.model with a generic cl100k regex: wrong pieces.
        raise TokenizerError(f"{d}: tiktoken.model without tokenizer.json; its pre-tokenizer regex "
                             "lives in the model's remote code: set tokenizer.trust_remote_code: true")
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(d), trust_remote_code=trust_remote_code)
    tok = Tokenizer(hf, "hf_dir", name=d.name) if getattr(hf, "backend_tokenizer", None) is not None \
        else _from_slow_tiktoken(hf, d)
    tok.renderer = hf
    return tok


def _from_slow_tiktoken(slow: Any, d: Path) -> Tokenizer:
    """A Python tokenizer around a tiktoken Encoding (Kimi-K2): rebuild it as a fast tokenizer from
    that Encoding's own ranks, regex and special tokens, and cross-check both on probe texts."""
    import tiktoken
    from transformers import PreTrainedTokenizerFast

    enc = next((v for v in vars(slow).values() if isinstance(v, tiktoken.Encoding)), None)
    if enc is None:
        raise TokenizerError(f"{d}: {type(slow).__name__} is a Python tokenizer without a tiktoken "
                             "core; provide a tokenizer.json (fast tokenizer) for this model")
    ranks = enc._mergeable_ranks
    specials = dict(enc._special_tokens)
    for i, t in slow.added_tokens_decoder.items():
        content = getattr(t, "content", str(t))
        if specials.setdefault(content, i) != i:
            raise TokenizerError(f"{d}: {content!r} is id {specials[content]} in the tiktoken core "
                                 f"but {i} in added_tokens_decoder; fix tokenizer_config.json")
    order = sorted((i, c) for c, i in specials.items())
    if order and (order[0][0] != len(ranks) or order[-1][0] != len(ranks) + len(order) - 1):
        raise TokenizerError(f"{d}: special ids {order[0][0]}..{order[-1][0]} do not follow the "
                             f"{len(ranks)} BPE ranks contiguously; not supported")
    core = build_from_ranks(ranks, enc._pat_str, nfc=False, added=[(i, c, True) for i, c in order])
    tok = Tokenizer(PreTrainedTokenizerFast(tokenizer_object=core,
                                            chat_template=getattr(slow, "chat_template", None)),
                    "hf_dir", tiktoken_core=lambda: enc, name=d.name)
    probes = list(PROBE_TEXTS) + [f"x{c}y" for _, c in order]
    bad = [t for t in probes if tok.encode(t) != enc.encode(t, allowed_special="all")
           or tok.encode_ordinary_batch_hf([t])[0] != enc.encode_ordinary(t)]
    if bad:
        raise TokenizerError(f"{d}: the fast conversion disagrees with the model's tiktoken core on "
                             f"{len(bad)} probe text(s), e.g. {bad[0]!r}; report this tokenizer")
    return tok
