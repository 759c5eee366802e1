"""bench/repair.py's row cache: keyed by the prompt files' bytes, not only by the datasets' names;
its --backend choice (the vLLM run itself starts the engine: not here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.repair import miss_kind, parser, prompt_files_digest  # noqa: E402


def test_other_prompt_files_under_the_same_dataset_names_key_other_rows(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, text in ((a, "write a haiku"), (b, "write a sonnet")):
        folder.mkdir()
        (folder / "chat.jsonl").write_text(f'{{"messages": [{{"role": "user", "content": "{text}"}}]}}\n')
    assert prompt_files_digest(str(a), ["chat"]) != prompt_files_digest(str(b), ["chat"])
    (b / "chat.jsonl").write_bytes((a / "chat.jsonl").read_bytes())
    assert prompt_files_digest(str(a), ["chat"]) == prompt_files_digest(str(b), ["chat"])


def test_a_missing_prompt_file_names_the_folder_to_pass():
    with pytest.raises(SystemExit, match="pass --raw"):
        prompt_files_digest(str(ROOT / "data" / "raw"), ["no_such_dataset"])


def test_backend_is_in_process_unless_vllm_is_asked_for(capsys):
    assert parser().parse_args([]).backend == "hf"
    assert parser().parse_args(["--backend", "vllm", "--only", "0", "1"]).backend == "vllm"
    with pytest.raises(SystemExit):
        parser().parse_args(["--backend", "sglang"])
    assert "invalid choice" in capsys.readouterr().err


def test_a_miss_is_the_searchs_only_where_the_sampled_ids_are_a_split_of_the_text_and_likelier():
    from draftgate.repair.search import Vocab
    from draftgate.serve.model import smollm2_tokenizer

    tok = smollm2_tokenizer()
    vocab = Vocab.from_tokenizer(tok)
    canon = tok.encode_ordinary("a <|endoftext|> b")       # the literal string, as text
    end = tok.token_id("<|endoftext|>")
    sampled = tok.encode_ordinary("a ") + [end] + tok.encode_ordinary(" b")
    assert vocab.bytes_of(sampled) == vocab.bytes_of(canon)
    # The model sampled the special token: no split of the text's ordinary tokens is it.
    assert miss_kind(vocab, canon, sampled, None, -1.0, -150.0) == "special_in_text"
    split = tok.encode_ordinary(" trans") + tok.encode_ordinary("pose")
    canon = tok.encode_ordinary(" transpose")
    assert miss_kind(vocab, canon, split, None, -3.0, -4.0) == "search_miss"
    assert miss_kind(vocab, canon, split, None, -4.0, -3.0) == "posterior_prefers_other"
    assert miss_kind(vocab, canon, split, "ambiguous", -3.0, -4.0) == "ambiguous"
