"""The official template: the template contract against it, and prompt ids the way engines make them.

A model directory is made at test time from the real SmolLM2 tokenizer and the chat template
embedded in its GGUF (nothing upstream is committed); a one-character edit of that template file
must fail the template gate, and prompts of an hf_dir target follow the directory's template.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from draftgate import schema
from draftgate.config import TokenizerParams
from draftgate.contract import check_template
from draftgate.templates.roles import template_roles
from draftgate.official import gguf_chat_template, official_template
from draftgate.reconstruct.core import Setup
from draftgate.templates import get_template
from draftgate.templates.probes import PROBES
from draftgate.templates.shapes import covering_corpus
from draftgate.tokenizers import load_tokenizer, smollm2_gguf
from reconstruct_fixtures import reconstruct_tables
from stages import gate_template

SUITE = Path(__file__).resolve().parents[1] / "expectations" / "template.json"
# What the template gate needs to pass: the probes and every shape the prompts stage admits.
FULL = PROBES + covering_corpus()


def model_dir(tmp_path: Path, smollm2_tok, edit=lambda t: t) -> Path:
    """An HF model directory of the SmolLM2 tokenizer whose chat template is the GGUF's, edited."""
    d = tmp_path / "model"
    smollm2_tok.hf.save_pretrained(str(d))
    template = edit(gguf_chat_template(smollm2_gguf()))
    (d / "chat_template.jinja").write_text(template, encoding="utf-8")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def hf_dir_official(d: Path):
    tok = load_tokenizer(TokenizerParams(kind="hf_dir", path=str(d)))
    return tok, official_template(tok, "hf_dir", str(d))


def run_template_gate(tmp_path: Path, result) -> tuple[int, set]:
    doc = tmp_path / "contract.json"
    doc.write_text(json.dumps(result.document()))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"gates": {"template": {"min_compared": 1}}}))
    code = gate_template.main([str(SUITE), str(doc), "--result", str(tmp_path / "r.json"),
                               "--params", str(tmp_path / "params.yaml"), "--no-docs"])
    r = json.loads((tmp_path / "r.json").read_text())
    return code, {e["kwargs"].get("column") for e in r["expectations"] if not e["success"]}


# ---------------------------------------------------------------- the template contract

def test_the_default_chatml_template_equals_the_one_embedded_in_the_gguf_on_every_comparable_probe(smollm2_tok):
    official = official_template(smollm2_tok, "smollm2")
    result = check_template(get_template("chatml"), official, PROBES)
    compared = [p for p in result.probes if p.status == "compared"]
    assert len(compared) >= 5 and result.ok
    assert all(p.official_text == p.code_text for p in compared)
    # What chatml cannot render (tools, reasoning, thinking) is refused, never rendered differently.
    assert {p.status for p in result.probes} == {"compared", "code_refuses"}
    assert official.sha256 == result.official["sha256"] and len(official.sha256) == 64


def test_the_model_directorys_own_template_passes_the_template_gate(tmp_path, smollm2_tok):
    _, official = hf_dir_official(model_dir(tmp_path, smollm2_tok))
    result = check_template(get_template("chatml"), official, FULL)
    assert result.ok and result.complete
    assert run_template_gate(tmp_path, result) == (0, set())


def test_a_one_character_change_in_the_template_file_fails_the_template_gate(tmp_path, smollm2_tok):
    _, official = hf_dir_official(model_dir(tmp_path, smollm2_tok,
                                            lambda t: t.replace("named SmolLM", "named SmolLm", 1)))
    result = check_template(get_template("chatml"), official, FULL)
    bad = [p for p in result.probes if not p.ok]
    assert bad and all(p.first_diff is not None and "SmolLm" in p.diff_context for p in bad)
    code, failed = run_template_gate(tmp_path, result)
    assert code == 1 and failed == {"differs"}


def test_a_conversation_only_the_code_template_can_render_fails_as_an_invented_format(tmp_path, smollm2_tok):
    def refuse_systems(t):
        return "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}" + t
    _, official = hf_dir_official(model_dir(tmp_path, smollm2_tok, refuse_systems))
    result = check_template(get_template("chatml"), official, FULL)
    assert "official_refuses" in {p.status for p in result.probes} and not result.ok
    # The shapes with a system turn are admitted (the code renders them) and never compared too.
    assert {g.feature for g in result.gaps()} >= {"first:system", "turn:system>user"}
    code, failed = run_template_gate(tmp_path, result)
    assert code == 1 and failed == {"code_invents", "uncovered"}


def test_without_an_official_template_nothing_is_compared_and_the_gate_needs_min_compared_0(tmp_path):
    result = check_template(get_template("qwen3"), None, FULL)
    assert {p.status for p in result.probes} == {"no_official"} and result.ok and result.complete
    code, failed = run_template_gate(tmp_path, result)
    assert code == 1 and failed == {"n_compared"}


def test_the_contract_records_the_ids_by_role_for_the_gates(smollm2_tok):
    t = get_template("chatml")
    roles = template_roles(t, {n: smollm2_tok.token_id(n) for n in t.special_names})
    assert roles["end_id"] == smollm2_tok.token_id("<|im_end|>")
    assert roles["think_open"] is None and roles["tool_pairs"] == []
    assert sorted(roles["turn_structure"]) == sorted(smollm2_tok.token_id(n) for n in t.special_names)


# ---------------------------------------------------------------- prompts as the engine renders them

def responses_for(tok, pids):
    rows = []
    for pid in pids:
        truth = tok.encode("Hello there.<|im_end|>")
        rows.append({"prompt_id": pid, "dataset": "chat", "status": "ok", "finish_reason": "stop",
                     "content": "Hello there.", "provider": "local", "truth_ids": truth,
                     "billed_completion_tokens": len(truth)})
    full = [{f: r.get(f) for f in schema.responses().names} for r in rows]
    return pa.Table.from_pylist(full, schema=schema.responses())


def prompts_for(pids, system=None):
    rows = []
    for pid in pids:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": f"Hi {pid}"}]
        rows.append({"prompt_id": pid, "dataset": "chat", "split": "train", "tools": None, "messages": json.dumps(msgs)})
    return pa.Table.from_pylist(rows)


@pytest.mark.parametrize("edit, agree", [(lambda t: t, True),
                                         (lambda t: t.replace("named SmolLM", "called SmolLM", 1), False)])
def test_hf_dir_prompt_ids_are_the_directory_templates_as_the_engine_encodes_them(tmp_path, smollm2_tok, edit, agree):
    tok, official = hf_dir_official(model_dir(tmp_path, smollm2_tok, edit))
    t = get_template("chatml")
    ids = {n: tok.token_id(n) for n in t.special_names}
    setup = Setup(tok, t, ids, False, official=official)
    table, result, _ = reconstruct_tables(responses_for(tok, ["a", "b"]), prompts_for(["a", "b"]), setup)
    rows = table.to_pylist()
    for r, pid in zip(rows, ["a", "b"]):
        engine = tok.encode(official.render([{"role": "user", "content": f"Hi {pid}"}], None, {}))
        assert r["input_ids"][:r["prompt_len"]] == engine and r["prompt_source"] == "official"
    key = "official_equals_code" if agree else "official_differs_from_code"
    assert dict(result.counts["prompt_render"]) == {key: 2}


def test_the_prompts_stage_rejects_what_the_model_directorys_own_template_refuses(tmp_path, smollm2_tok):
    from stages.prompts import main as prompts_stage

    def refuse_systems(t):
        return "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}" + t
    d = model_dir(tmp_path, smollm2_tok, refuse_systems)
    (tmp_path / "raw").mkdir()
    lines = [{"messages": [{"role": "user", "content": "Hi"}]},
             {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}]
    (tmp_path / "raw" / "chat.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"tokenizer": {"kind": "hf_dir", "path": str(d)}, "template": {"name": "chatml"}}))
    assert prompts_stage(["--params", str(tmp_path / "params.yaml"), "--raw", str(tmp_path / "raw"),
                          "--out", str(tmp_path / "out"), "--metrics", str(tmp_path / "m.json")]) == 0
    import pyarrow.parquet as pq

    rejects = pq.read_table(tmp_path / "out" / "rejects.parquet").to_pylist()
    assert [(r["source"], r["reason"]) for r in rejects] == [("chat.jsonl:2", "template_unsupported")]
    assert "no system turns" in rejects[0]["detail"]


# A tokenizer class shipped as a model directory's remote code, whose apply_chat_template
# prepares a template variable from `tools` first, the way Kimi-K2.5's tokenization_kimi.py
# declares tools in TypeScript style. Written for this test; the declaration is draftgate's own.
HOOK = '''
from transformers import PreTrainedTokenizerFast

from draftgate.templates.kimi_tools_ts import ts_declaration


class HookTokenizer(PreTrainedTokenizerFast):
    def apply_chat_template(self, conversation, tools=None, **kwargs):
        if tools:
            kwargs["tools_ts_str"] = ts_declaration(tools)
        return super().apply_chat_template(conversation, tools=tools, **kwargs)
'''
HOOK_TEMPLATE = ("{% if tools_ts_str %}<|im_system|>tool_declare<|im_middle|>{{ tools_ts_str }}<|im_end|>{% endif %}"
                 "{% for m in messages %}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>{% endfor %}"
                 "<|im_assistant|>assistant<|im_middle|>")


def test_the_model_directorys_tokenizer_hooks_shape_the_official_render(tmp_path, kimi_standin_tok):
    from draftgate.templates.kimi_tools_ts import ts_declaration
    from draftgate.templates.probes import WEATHER

    d = tmp_path / "kimi-like"
    kimi_standin_tok.hf.save_pretrained(str(d))
    (d / "tokenization_hook.py").write_text(HOOK)
    (d / "chat_template.jinja").write_text(HOOK_TEMPLATE)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    cfg.update(tokenizer_class="HookTokenizer", auto_map={"AutoTokenizer": [None, "tokenization_hook.HookTokenizer"]})
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))

    tok = load_tokenizer(TokenizerParams(kind="hf_dir", path=str(d), trust_remote_code=True))
    official = official_template(tok, "hf_dir", str(d))
    text = official.render([{"role": "user", "content": "Weather in Paris?"}], [WEATHER], {})
    assert text.startswith("<|im_system|>tool_declare<|im_middle|>" + ts_declaration([WEATHER]) + "<|im_end|>")
    assert "namespace functions" in text
    # The hook's code is part of what the contract records about the official template.
    assert official.hooks_sha256 is not None and len(official.hooks_sha256) == 64


def test_the_ggufs_template_is_read_from_the_file_once_per_content_and_then_from_the_cache(tmp_path, monkeypatch):
    # GGUFReader parses every metadata field to give one (~2.5 s a process): the contract stage and
    # every test process would pay it. The field is kept in draftgate's cache, keyed by the file.
    import gguf

    from draftgate import cache, official

    monkeypatch.setenv("DRAFTGATE_CACHE", str(tmp_path))
    path = smollm2_gguf()
    read = official._gguf_chat_template.__wrapped__            # past the in-process memo
    text = read(str(path), 0, 0)
    assert text == gguf.GGUFReader(str(path)).fields["tokenizer.chat_template"].contents()
    [entry] = tmp_path.glob("gguf-chat-template-*")
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["inputs"] == {"gguf_sha256": cache.file_sha256(path)}

    def unread(*args, **kwargs):
        raise AssertionError("the GGUF was parsed again")
    monkeypatch.setattr(gguf, "GGUFReader", unread)
    assert read(str(path), 0, 0) == text
