"""`draftgate estimate`: tokens, cost and wall time projected from params and prompts, nothing sent."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from draftgate import cli, schema


def setup(tmp, tokenizer: dict, **generate) -> list[str]:
    rows = [{"prompt_id": f"id{i}", "dataset": "tiny", "split": "train", "source": f"t.jsonl:{i + 1}",
             "messages": json.dumps([{"role": "user", "content": "hello world"}]), "tools": None,
             "n_duplicates": 0} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.prompts()), tmp / "prompts.parquet")
    gp = {"backend": "openrouter", "max_tokens": 100, "concurrency": 2,
          "price": {"prompt_usd_per_mtok": 1.0, "completion_usd_per_mtok": 2.0}, **generate}
    (tmp / "params.yaml").write_text(yaml.safe_dump({"tokenizer": tokenizer, "generate": gp}))
    return ["estimate", "--params", str(tmp / "params.yaml"), "--table", str(tmp / "prompts.parquet")]


def test_prompt_tokens_are_counted_with_the_configured_tokenizer(tmp_path, capsys):
    args = setup(tmp_path, {"kind": "qwen3"})
    assert cli.main(args + ["--json", "--fill", "0.5", "--ttft-s", "1", "--decode-tok-s", "50"]) == 0
    e = json.loads(capsys.readouterr().out)
    # Qwen3: "hello world" is [14990, 1879]; plus 5 template tokens for the one message, 3 prompts.
    assert (e["prompt_tokens"], e["prompt_tokens_method"]) == (21, "tokenizer:qwen3")
    assert (e["completion_tokens_max"], e["completion_tokens_typical"]) == (300, 150)
    assert e["cost_usd_max"] == round((21 * 1.0 + 300 * 2.0) / 1e6, 4)
    assert (e["wall_s_max"], e["wall_s_typical"]) == (2 * (1 + 2.0), 2 * (1 + 1.0))   # 2 waves of 2


def test_without_a_tokenizer_it_falls_back_to_chars_over_4_and_says_why(tmp_path, capsys):
    args = setup(tmp_path, {"kind": "hf_dir", "path": str(tmp_path / "no-such-dir")})
    assert cli.main(args + ["--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["prompt_tokens"] == -(-33 // 4) + 15
    assert e["prompt_tokens_method"].startswith("chars/4 (no tokenizer: ")


def test_the_table_warns_when_the_worst_case_exceeds_the_budget(tmp_path, capsys):
    args = setup(tmp_path, {"kind": "qwen3"}, budget_usd=0.0001)
    assert cli.main(args + ["--no-tokenizer"]) == 0
    out = capsys.readouterr().out
    assert "chars/4 (no tokenizer: --no-tokenizer)" in out
    assert "worst case exceeds the budget" in out


def test_a_missing_prompts_file_is_a_clear_error(tmp_path, capsys):
    args = setup(tmp_path, {"kind": "qwen3"})
    (tmp_path / "prompts.parquet").unlink()
    assert cli.main(args) == 2
    assert "run the prompts stage first" in capsys.readouterr().err


def test_it_warns_when_the_generate_stage_would_refuse_the_budget(tmp_path, capsys):
    args = setup(tmp_path, {"kind": "qwen3"}, budget_usd=0)
    assert cli.main(args + ["--no-tokenizer"]) == 0
    assert "will refuse these params: generate.budget_usd is 0 (no budget)" in capsys.readouterr().err


def test_prompts_n_plans_a_larger_run_from_the_table_as_a_sample(tmp_path, capsys):
    args = setup(tmp_path, {"kind": "qwen3"}, limit=1)
    assert cli.main(args + ["--prompts", "3000", "--json", "--ttft-s", "1", "--decode-tok-s", "50"]) == 0
    e = json.loads(capsys.readouterr().out)
    # The 3 sampled prompts hold 21 tokens (7 each): 3,000 prompts, 21,000; generate.limit does not cap a plan.
    assert (e["prompts"], e["prompt_tokens"]) == (3000, 21_000)
    assert e["prompt_tokens_method"] == "tokenizer:qwen3, scaled from 3 prompts"
    assert e["completion_tokens_max"] == 300_000
    assert e["cost_usd_max"] == round((21_000 * 1.0 + 300_000 * 2.0) / 1e6, 4)
    assert e["wall_s_max"] == 1500 * (1 + 2.0)   # 1,500 waves of 2 in flight


def test_prompts_takes_a_count_and_says_where_the_table_goes(tmp_path, capsys):
    args = setup(tmp_path, {"kind": "qwen3"})
    with pytest.raises(SystemExit) as exit_:
        cli.main(args + ["--prompts", str(tmp_path / "prompts.parquet")])
    assert exit_.value.code == 2
    assert "--prompts takes a count of prompts" in capsys.readouterr().err
