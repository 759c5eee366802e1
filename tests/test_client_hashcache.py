"""The request-hash cache beside the journal: used only when its key matches and a sample agrees."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from draftgate.client import hashcache
from draftgate.client.journal import digest64
from draftgate.client.request import build_body, request_hash
from draftgate.client.table import PromptFile
from draftgate.config import GenerateParams
from draftgate.serve.scripted import Script, running
from stages import generate
from test_stage_generate import argv, workspace


def params(**over) -> GenerateParams:
    return GenerateParams(**{"backend": "openai", "model": "m", **over})


def hashes_of(prompts: PromptFile, p: GenerateParams, identity=None) -> bytes:
    return b"".join(bytes.fromhex(request_hash(build_body(x, p), p.backend, identity)) for x in prompts())


def test_the_key_moves_with_the_prompt_file_the_rows_the_params_and_the_served_identity():
    base = hashcache.cache_key("a" * 64, 10, params(), None)
    assert base == hashcache.cache_key("a" * 64, 10, params(), None)
    assert len({base, hashcache.cache_key("b" * 64, 10, params(), None),
                hashcache.cache_key("a" * 64, 9, params(), None),
                hashcache.cache_key("a" * 64, 10, params(temperature=0.3), None),
                hashcache.cache_key("a" * 64, 10, params(), {"weights": "w2"})}) == 5
    # Not what makes an answer: concurrency, retries, budget.
    assert base == hashcache.cache_key("a" * 64, 10, params(concurrency=7, max_attempts=2), None)


def test_a_missing_torn_or_foreign_cache_file_is_not_used(tmp_path):
    path = tmp_path / "journal.jsonl.hashes"
    assert hashcache.load(path, "k", 2) is None
    hashcache.save(path, "k", b"\x01" * 64, b"\x02" * 16)
    assert hashcache.load(path, "k", 2) == (b"\x01" * 64, b"\x02" * 16)
    assert hashcache.load(path, "other", 2) is None
    assert hashcache.load(path, "k", 3) is None
    path.write_bytes(path.read_bytes()[:-1])              # torn: one byte short
    assert hashcache.load(path, "k", 2) is None
    path.write_bytes(b"not json\n")
    assert hashcache.load(path, "k", 2) is None


def test_a_cache_whose_sampled_hashes_disagree_with_the_prompts_is_not_used(tmp_path):
    paths = workspace(tmp_path, 100)
    prompts, p = PromptFile(paths["prompts"]), params()
    journal = tmp_path / "journal.jsonl"
    key = hashcache.cache_key(hashcache.file_sha256(paths["prompts"]), len(prompts), p, None)
    right = hashes_of(prompts, p)
    keys = b"".join(digest64(x.prompt_id).to_bytes(8, "little") for x in prompts())
    hashcache.save(hashcache.cache_path(journal), key, right, keys)
    assert hashcache.checked(prompts, p, None, journal) == (key, (right, keys))
    # The same key over other hashes: what a changed way of hashing messages would leave behind.
    last = len(right) - 32
    hashcache.save(hashcache.cache_path(journal), key, right[:last] + bytes(32), keys)
    assert hashcache.checked(prompts, p, None, journal) == (key, None)
    hashcache.save(hashcache.cache_path(journal), key, right, bytes(8) + keys[8:])
    assert hashcache.checked(prompts, p, None, journal) == (key, None)


def test_a_rerun_reads_the_hashes_from_the_cache_and_writes_the_same_table(tmp_path, monkeypatch):
    with running(Script()) as server:
        paths = workspace(tmp_path, 40, base_url=server.base_url)
        assert generate.main(argv(paths)) == 0
        cache = Path(paths["out"]) / "journal.jsonl.hashes"
        assert cache.is_file()
        first = pq.read_table(Path(paths["out"]) / "responses.parquet")

        calls = []
        real = hashcache.request_hash

        def counting(*a, **k):
            calls.append(1)
            return real(*a, **k)
        monkeypatch.setattr(hashcache, "request_hash", counting)
        monkeypatch.setattr(sys.modules["draftgate.client.run"], "request_hash", counting)
        assert generate.main(argv(paths)) == 0
        again = pq.read_table(Path(paths["out"]) / "responses.parquet")
        assert server.requests == 40
    assert again.equals(first)
    # The key's empty prompt and the sample, not the 40 prompts: the run itself hashed none.
    assert len(calls) == 1 + min(40, hashcache.SAMPLE)

    # A param that shapes the answer changes the key: every prompt is hashed (and sent) again.
    p = yaml.safe_load(Path(paths["params"]).read_text())
    p["generate"]["temperature"] = 0.3
    Path(paths["params"]).write_text(yaml.safe_dump(p))
    calls.clear()
    with running(Script()) as server:
        p["generate"]["base_url"] = server.base_url
        Path(paths["params"]).write_text(yaml.safe_dump(p))
        assert generate.main(argv(paths)) == 0
        assert server.requests == 40
    assert len(calls) >= 40


def test_with_the_cache_a_rerun_still_sends_what_the_journal_lacks(tmp_path):
    with running(Script()) as server:
        paths = workspace(tmp_path, 40, base_url=server.base_url)
        assert generate.main(argv(paths)) == 0
        journal = Path(paths["out"]) / "journal.jsonl"
        lines = journal.read_bytes().splitlines(keepends=True)
        journal.write_bytes(b"".join(lines[:30]))       # ten answers lost (a restored older copy)
        assert generate.main(argv(paths)) == 0
        assert server.requests == 50
    table = pq.read_table(Path(paths["out"]) / "responses.parquet").to_pylist()
    assert len(table) == 40 and all(r["status"] == "ok" for r in table)


def test_a_first_run_leaves_the_journals_scan_so_the_next_run_parses_no_old_line(tmp_path, monkeypatch):
    from draftgate.client import journal as journal_mod

    with running(Script()) as server:
        paths = workspace(tmp_path, 30, base_url=server.base_url)
        assert generate.main(argv(paths)) == 0
        assert (Path(paths["out"]) / "journal.jsonl.index").is_file()
        parsed = []
        real = journal_mod._parse
        monkeypatch.setattr(journal_mod, "_parse", lambda b: parsed.append(b) or real(b))
        assert generate.main(argv(paths)) == 0
        assert server.requests == 30
    assert parsed == []
