import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgate import schema
from stages.prompts import main

REPO = Path(__file__).resolve().parents[1]
USER = {"role": "user", "content": "Name a prime number."}


def write_lines(path: Path, rows) -> None:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "params.yaml").write_text("prompts:\n  heldout_fraction: 0.25\n  split_seed: 3\n")
    return tmp_path


def run(workdir, raw=None):
    return main(["--params", str(workdir / "params.yaml"), "--raw", str(raw or workdir / "raw"),
                 "--out", str(workdir / "out"), "--metrics", str(workdir / "metrics" / "prompts.json")])


def test_the_stage_writes_prompts_rejects_and_metrics_with_exact_schemas(workdir):
    write_lines(workdir / "raw" / "chat.jsonl", [{"messages": [USER]}, b"{oops", {"messages": [USER]}])
    pq.write_table(pa.table({"conversations": [[{"from": "human", "value": "Say hi."}], [{"from": "bot", "value": "x"}]]}),
                   workdir / "raw" / "more.parquet")
    assert run(workdir) == 0
    prompts = pq.read_table(workdir / "out" / "prompts.parquet")
    rejects = pq.read_table(workdir / "out" / "rejects.parquet")
    assert prompts.schema == schema.prompts() and rejects.schema == schema.rejects()
    assert prompts.column("dataset").to_pylist() == ["chat", "more"]
    assert prompts.column("n_duplicates").to_pylist() == [1, 0]
    assert sorted(zip(rejects.column("source").to_pylist(), rejects.column("reason").to_pylist())) == [
        ("chat.jsonl:2", "invalid_json"), ("more.parquet:row 1", "unknown_role")]
    metrics = json.loads((workdir / "metrics" / "prompts.json").read_text())
    assert (metrics["rows_in"], metrics["rows_out"], metrics["dropped"]) == (5, 2, 3)
    from draftgate.metrics import details_path

    details = json.loads(details_path(workdir / "metrics" / "prompts.json").read_text())
    assert details["params"] == {"datasets": None, "heldout_fraction": 0.25, "split_seed": 3, "max_prompts": None,
                                 "context_tokens": None, "split_by": "prompt", "near_duplicate_threshold": 0.8,
                                 "thinking": {}}
    assert not list((workdir / "out").glob(".*.tmp"))


def test_the_stage_refuses_to_run_unless_each_contract_gate_passed(workdir, capsys):
    write_lines(workdir / "raw" / "chat.jsonl", [{"messages": [USER]}])
    passed, failed = workdir / "contract.json", workdir / "template.json"
    passed.write_text(json.dumps({"success": True, "checks": 5, "failed": 0}))
    failed.write_text(json.dumps({"success": False, "checks": 5, "failed": 1}))
    args = ["--params", str(workdir / "params.yaml"), "--raw", str(workdir / "raw"), "--out", str(workdir / "out"),
            "--metrics", str(workdir / "metrics" / "prompts.json"), "--gate", str(passed)]
    assert main(args + ["--gate", str(failed)]) == 2
    assert "gate_template did not pass (success: False, 1 of 5 checks failed)" in capsys.readouterr().err
    assert not (workdir / "out").exists()
    assert main(args) == 0


def test_the_stage_exits_zero_when_every_record_is_rejected(workdir):
    write_lines(workdir / "raw" / "bad.jsonl", [b"[]", {"messages": []}])
    assert run(workdir) == 0
    assert pq.read_table(workdir / "out" / "prompts.parquet").num_rows == 0
    assert pq.read_table(workdir / "out" / "rejects.parquet").num_rows == 2


def test_the_stage_exits_two_naming_the_problem_on_unusable_input(workdir, capsys):
    assert run(workdir) == 2
    assert "no *.jsonl or *.parquet files" in capsys.readouterr().err
    assert run(workdir, raw=workdir / "missing") == 2
    assert "not a directory" in capsys.readouterr().err
    (workdir / "raw" / "broken.parquet").write_bytes(b"PAR1 not really")
    assert run(workdir) == 2
    assert "broken.parquet: cannot be read" in capsys.readouterr().err
    assert not (workdir / "out").exists()


def test_a_params_typo_exits_two_naming_the_key(workdir, capsys):
    write_lines(workdir / "raw" / "chat.jsonl", [{"messages": [USER]}])
    (workdir / "params.yaml").write_text("prompts:\n  heldout_fraktion: 0.1\n")
    assert run(workdir) == 2
    assert "prompts.heldout_fraktion: unknown key" in capsys.readouterr().err


def test_the_module_runs_as_a_script_with_exit_codes(workdir):
    write_lines(workdir / "raw" / "chat.jsonl", [{"messages": [USER]}])
    cmd = [sys.executable, "-m", "stages.prompts", "--params", str(workdir / "params.yaml"), "--raw", str(workdir / "raw"),
           "--out", str(workdir / "out"), "--metrics", str(workdir / "m.json")]
    ok = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0 and "1 records -> 1 prompts" in ok.stdout
    cmd[cmd.index("--raw") + 1] = str(workdir / "nowhere")
    assert subprocess.run(cmd, cwd=REPO, capture_output=True, text=True).returncode == 2


def test_the_bundled_prompt_sets_ingest_with_zero_rejects(workdir):
    # qwen3: a template that renders tool prompts too (ChatML rejects them, tested below).
    (workdir / "params.yaml").write_text("template:\n  name: qwen3\n")
    assert run(workdir, raw=REPO / "data" / "raw") == 0
    prompts = pq.read_table(workdir / "out" / "prompts.parquet").to_pylist()
    metrics = json.loads((workdir / "metrics" / "prompts.json").read_text())
    assert metrics["n_rejects"] == 0 and metrics["n_duplicates"] == 2
    assert {d: v["out"] for d, v in metrics["datasets"].items()} == {"chat": 60, "code": 58, "tools": 30}
    assert all(p["tools"] for p in prompts if p["dataset"] == "tools")
    with_tool_turns = [p for p in prompts if '"role":"tool"' in p["messages"]]
    assert len(with_tool_turns) >= 8
    assert 0.03 <= metrics["heldout_fraction"] <= 0.25


def test_the_prompts_suite_passes_the_bundled_sets_and_fails_a_reject_over_the_threshold(workdir, tmp_path):
    from draftgate.gates import validate as gates

    (workdir / "params.yaml").write_text("prompts:\n  heldout_fraction: 0.1\ntemplate:\n  name: qwen3\n")
    raw = tmp_path / "bundle"
    raw.mkdir()
    for f in (REPO / "data" / "raw").glob("*.jsonl"):
        (raw / f.name).write_bytes(f.read_bytes())
    assert run(workdir, raw=raw) == 0
    out = workdir / "out"
    args = [str(REPO / "expectations" / "prompts.json"), str(out / "prompts.parquet"),
            "--input", f"rejects={out / 'rejects.parquet'}", "--params", str(workdir / "params.yaml"), "--no-docs",
            "--result", str(tmp_path / "gate.json")]
    assert gates.main(args) == 0
    with open(raw / "chat.jsonl", "a") as f:
        f.write('{"messages": [{"role": "narrator", "content": "hi"}]}\n')
    (workdir / "params.yaml").write_text("prompts:\n  heldout_fraction: 0.1\ntemplate:\n  name: qwen3\n"
                                         "gates:\n  prompts:\n    max_rejects_rate: 0.0\n")
    assert run(workdir, raw=raw) == 0
    assert gates.main(args) == 1
    failed = [e for e in json.loads((tmp_path / "gate.json").read_text())["expectations"] if not e["success"]]
    assert [(e["kwargs"].get("column"), e["observed_value"]) for e in failed] == [("rejects_rate", pytest.approx(1 / 151))]


TOOL = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                         "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}


def test_prompts_the_target_template_cannot_render_are_rejected_before_any_request(workdir):
    write_lines(workdir / "raw" / "tools.jsonl", [{"messages": [USER], "tools": [TOOL]}, {"messages": [USER]}])
    (workdir / "params.yaml").write_text("template:\n  name: chatml\n")
    assert run(workdir) == 0
    [reject] = pq.read_table(workdir / "out" / "rejects.parquet").to_pylist()
    assert (reject["source"], reject["reason"]) == ("tools.jsonl:1", "template_unsupported")
    assert "template.name" in reject["detail"] and "prompts.datasets" in reject["detail"]

    (workdir / "params.yaml").write_text("template:\n  name: qwen3\n")
    assert run(workdir) == 0
    assert pq.read_table(workdir / "out" / "rejects.parquet").num_rows == 0
    assert pq.read_table(workdir / "out" / "prompts.parquet").num_rows == 2


def test_prompts_datasets_selects_raw_files_by_stem_and_names_unknown_ones(workdir, capsys):
    write_lines(workdir / "raw" / "chat.jsonl", [{"messages": [USER]}])
    write_lines(workdir / "raw" / "code.jsonl", [{"messages": [{"role": "user", "content": "Write a loop."}]}])
    (workdir / "params.yaml").write_text("prompts:\n  datasets: [code]\n")
    assert run(workdir) == 0
    assert pq.read_table(workdir / "out" / "prompts.parquet").column("dataset").to_pylist() == ["code"]

    (workdir / "params.yaml").write_text("prompts:\n  datasets: [code, tools]\n")
    assert run(workdir) == 2
    err = capsys.readouterr().err
    assert "['tools']" in err and "available: ['chat', 'code']" in err


def test_a_nan_inside_a_parquet_tool_schema_is_a_reject_with_file_and_row_not_a_crash(workdir):
    # A float column in a tool schema reads back as float('nan'): JSON cannot hold it.
    tool = lambda bound: [{"type": "function", "function": {"name": "clip", "parameters": {
        "type": "object", "properties": {"x": {"type": "number", "maximum": bound}}}}}]
    rows = [{"messages": [USER], "tools": tool(1.0)}, {"messages": [USER], "tools": tool(float("nan"))},
            {"messages": [{"role": "user", "content": "Inf?"}], "tools": tool(float("inf"))}]
    pq.write_table(pa.Table.from_pylist(rows), workdir / "raw" / "tools.parquet")
    (workdir / "params.yaml").write_text("prompts:\n  heldout_fraction: 0.25\ntemplate:\n  name: qwen3\n")
    assert run(workdir) == 0
    [kept] = pq.read_table(workdir / "out" / "prompts.parquet").to_pylist()
    assert json.loads(kept["tools"])[0]["function"]["parameters"]["properties"]["x"]["maximum"] == 1.0
    rejects = pq.read_table(workdir / "out" / "rejects.parquet").to_pylist()
    assert [(r["source"], r["reason"]) for r in rejects] == [
        ("tools.parquet:row 1", "bad_tool_schema"), ("tools.parquet:row 2", "bad_tool_schema")]
    assert rejects[0]["detail"].startswith("tools[0].function.parameters.properties.x.maximum is nan")
    metrics = json.loads((workdir / "metrics" / "prompts.json").read_text())
    assert metrics["drops_by_reason"] == {"bad_tool_schema": 2}


# ---------------------------------------------------------------- the target's context

def rendered_len(tok, content):
    """Tokens of a one-turn prompt as the target renders it (chatml, the embedded SmolLM2)."""
    from draftgate.templates import encode_segments, get_template

    t = get_template("chatml")
    segs = t.render_prompt([{"role": "user", "content": content}], None, False)
    return len(encode_segments(tok, [segs], {n: tok.token_id(n) for n in t.special_names})[0])


def test_a_prompt_past_the_targets_context_less_max_tokens_is_rejected_too_long_with_file_line(workdir, smollm2_tok):
    # context 64 - max_tokens 16 leaves 48 prompt tokens: one that renders to 48 fits, 49 does not.
    words = next(n for n in range(1, 64) if rendered_len(smollm2_tok, " x" * n) == 48)
    assert rendered_len(smollm2_tok, " x" * (words + 1)) == 49
    write_lines(workdir / "raw" / "chat.jsonl", [{"messages": [{"role": "user", "content": " x" * words}]},
                                                 {"messages": [{"role": "user", "content": " x" * (words + 1)}]},
                                                 {"messages": [{"role": "user", "content": "far past " * 50_000}]}])
    (workdir / "params.yaml").write_text("prompts:\n  context_tokens: 64\ngenerate:\n  max_tokens: 16\n")
    assert run(workdir) == 0
    assert pq.read_table(workdir / "out" / "prompts.parquet").num_rows == 1
    rejects = pq.read_table(workdir / "out" / "rejects.parquet").to_pylist()
    assert [(r["source"], r["reason"]) for r in rejects] == [("chat.jsonl:2", "too_long"), ("chat.jsonl:3", "too_long")]
    assert "the prompt is 49 tokens" in rejects[0]["detail"] and "leaves 48" in rejects[0]["detail"]
    assert "generate.max_tokens" in rejects[0]["detail"] and "prompts.context_tokens" in rejects[0]["detail"]
    # 450 KB: refused by its bytes (no token spans more than the widest), never encoded.
    assert "the prompt is at least" in rejects[1]["detail"]
    metrics = json.loads((workdir / "metrics" / "prompts.json").read_text())
    assert metrics["drops_by_reason"] == {"too_long": 2}
    from draftgate.metrics import details_path

    assert metrics["prompt_length"] == {"max_prompt_tokens": 48, "context": 64}
    details = json.loads(details_path(workdir / "metrics" / "prompts.json").read_text())
    assert details["prompt_length"]["source"] == "prompts.context_tokens"


def test_max_tokens_that_fill_the_context_stop_the_stage_naming_both_keys(workdir, capsys):
    write_lines(workdir / "raw" / "chat.jsonl", [{"messages": [USER]}])
    (workdir / "params.yaml").write_text("prompts:\n  context_tokens: 64\ngenerate:\n  max_tokens: 64\n")
    assert run(workdir) == 2
    assert "generate.max_tokens: 64 leaves no room for a prompt in the target's context (prompts.context_tokens 64)" \
        in capsys.readouterr().err


def test_the_demo_context_is_the_embedded_models_own():
    # params.yaml states it because the GGUF's tokenizer declares none; the model's config does.
    import yaml

    from draftgate.serve.model import cached_weights

    config = json.loads((cached_weights().path / "config.json").read_text())
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert params["prompts"]["context_tokens"] == config["max_position_embeddings"] == 8192
