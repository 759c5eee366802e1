"""One-line edits of each variant's official template fail the template contract (issue 31).

Every variant's official-like template (near_miss_fixtures.py; chatml's is the GGUF's own) equals
the code template on the fixed probes, the seeded corpus and the covering corpus, and covers every
shape feature; each near miss of it fails, at least one per shape family the template renders.
The `blind` ones pass the fixed probes and the seeded corpus: only the covering corpus shows them.
Measured (one core): ~0.3 s a contract over the ~440 conversations.
"""

from __future__ import annotations

import pytest

from draftgate.contract import check_template
from draftgate.official import OfficialTemplate, gguf_chat_template
from draftgate.templates import get_template
from draftgate.templates.corpus import generated_corpus
from draftgate.templates.probes import PROBES
from draftgate.templates.shapes import covering_corpus
from draftgate.tokenizers import smollm2_gguf
from near_miss_fixtures import LIKE, NEAR_MISSES, official_like
from test_official import run_template_gate

SEEDED = PROBES + generated_corpus(0, 300)
EVERYTHING = SEEDED + covering_corpus()
CASES = [(name, miss) for name, misses in NEAR_MISSES.items() for miss in misses]


@pytest.fixture(scope="module")
def official(qwen3_tok, kimi_standin_tok, smollm2_tok):
    def make(name: str, edit=None) -> OfficialTemplate:
        if name == "chatml":
            text = gguf_chat_template(smollm2_gguf())
            return OfficialTemplate("SmolLM2 GGUF", "-", None, smollm2_tok.hf, edit.apply(text) if edit else text)
        text = LIKE[name]
        return official_like(name, edit.apply(text) if edit else text, qwen3_tok, kimi_standin_tok)
    return make


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_each_variants_official_like_template_passes_byte_for_byte_with_every_admitted_feature_compared(name, official):
    result = check_template(get_template(name), official(name), EVERYTHING)
    assert result.ok and not result.gaps()
    assert [p.probe for p in result.probes if not p.ok] == []
    assert sum(c.status == "compared" for c in result.coverage) >= 25


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_each_variant_has_a_near_miss_in_every_family_it_renders(name):
    families = {m.family for m in NEAR_MISSES[name]}
    assert {"order", "fields"} <= families
    refused_outright = {"chatml": {"tools", "calls", "mode"}, "kimi_k2": {"calls", "reasoning", "mode"},
                        "kimi_k2_thinking": {"mode"}}.get(name, set())
    assert {"order", "fields", "tools", "calls", "reasoning", "mode"} - refused_outright <= families


@pytest.mark.parametrize("name,miss", CASES, ids=[f"{n}-{m.name}" for n, m in CASES])
def test_a_one_line_edit_of_the_official_template_fails_the_contract(name, miss, official):
    result = check_template(get_template(name), official(name, miss), EVERYTHING)
    assert not result.ok
    assert any(p.status == "compared" and p.official_text != p.code_text for p in result.probes)
    if miss.blind:   # the seeded probes and corpus alone never show it
        seeded = check_template(get_template(name), official(name, miss), SEEDED)
        assert all(p.ok for p in seeded.probes)


def test_the_template_gate_fails_a_blind_near_miss_on_the_covering_corpus(tmp_path, official):
    [miss] = [m for m in NEAR_MISSES["kimi_k25"] if m.name == "empty_name_kept"]
    result = check_template(get_template("kimi_k25"), official("kimi_k25", miss), EVERYTHING)
    code, failed = run_template_gate(tmp_path, result)
    assert code == 1 and failed == {"differs"}
