"""The real vLLM (.venv-engine) in the loop: the launcher, generate's `backend: vllm`, repair's
VllmScorer and the template contract's `contract.engine: vllm`, against ONE engine serving the
embedded SmolLM2 (module scope, eager, `--enable-scale-out` for its render endpoint, and the
hidden capture the repair stage starts it with; its start: ~30 s on 2 quiet cores, ~80 s under
load). Generation stays tiny. The hidden stage's `backend: vllm` (its own offline engine, the
file's second start) runs on the repair stage's output: it copies the row repair's engine prefilled
and writes the in-process layout; the hidden gate stays the second opinion and fails a connector
that captures the wrong layer or shifts positions.

What the engine must show (FACTS, "The real vLLM on this CPU"): the served prompt ids are
draftgate's rendering, the choice's ids are the truth (equal to our model's own greedy ids), the
bill counts the end token, prompt log-probabilities equal the in-process scorer's, and the
launcher leaves no process and no bound port behind. The last test ends the shared engine the way
an exception in a stage ends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from draftgate import schema
from draftgate.engine.launch import EngineError, group_members, launch_settings, running_vllm
from draftgate.engine.render import SCALE_OUT_FLAG
from engine_fixtures import SERVED_NAME, START_TIMEOUT_S, engine_python, model_dir
from test_repair_score import local_model

REPO = Path(__file__).resolve().parents[1]
# Three prompts the model answers within MAX_TOKENS greedily (a stop shows the end token), one
# it does not (a length finish).
PROMPTS = ["Reply with the single word yes.", "What is 2 + 2? Answer with a number only.",
           "Write a long story about a dragon."]
MAX_TOKENS = 24
LAYERS = (1, 14, 26)      # EAGLE-3's default for SmolLM2's 30 layers (what hidden.layers null resolves to)


def stage_args(prefill: Path) -> tuple[str, ...]:
    """The server flags the repair stage adds to start its engine (repair/engine.py engine_scorer)."""
    from draftgate.config import HiddenParams
    from draftgate.engine.spool import server_args
    from draftgate.repair.engine import SPOOL, scoring_args
    from draftgate.target import describe_target

    capture = server_args(LAYERS, describe_target(HiddenParams()).num_layers, (prefill / SPOOL).resolve(),
                          prefix_cache=True)
    return capture + scoring_args("cpu")


class Shared:
    """The module's engine, stoppable early by the last test (as an exception in a block stops it).

    Started as the repair stage starts it to share its first pass with the hidden stage
    (repair/engine.py): with the hidden backend's capture (engine/spool.py `server_args`), its
    spool at `<prefill>/.vllm`, where the stage looks for it, and the search's scoring flags
    (a prefix cache, `scoring_args`). Only requests that name a file are
    written, and only requests that ask for logprobs read them, so every other test sees the
    server a generate run starts."""

    def __init__(self, prefill: Path) -> None:
        from draftgate.config import EngineParams

        self.prefill = prefill
        # The render endpoint (the template contract's engine rendering) needs --enable-scale-out;
        # it only registers routes.
        settings = launch_settings(EngineParams(python=str(engine_python()), kvcache_gib=1,
                                                start_timeout_s=START_TIMEOUT_S,
                                                extra_args=[SCALE_OUT_FLAG, *stage_args(prefill)]))
        self.cm = running_vllm(model_dir(), served_name=SERVED_NAME, **settings)
        self.engine = self.cm.__enter__()
        self.open = True

    def exit(self, exc: BaseException | None) -> bool | None:
        self.open = False
        return self.cm.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    s = Shared(tmp_path_factory.mktemp("shared_prefill") / "prefill")
    try:
        yield s
    finally:
        if s.open:
            s.exit(None)


@pytest.fixture(scope="module")
def engine(shared):
    return shared.engine


@pytest.fixture(scope="module")
def lm():
    return local_model()


@pytest.fixture(scope="module")
def generated(engine, tmp_path_factory):
    """The generate stage, backend vllm, against the running engine: (responses, prompts) tables."""
    from stages import generate

    d = tmp_path_factory.mktemp("generate")
    rows = [{"prompt_id": f"id{i:04d}", "dataset": "tiny", "split": "train", "source": f"tiny.jsonl:{i + 1}",
             "messages": json.dumps([{"role": "user", "content": text}]), "tools": None, "n_duplicates": 0}
            for i, text in enumerate(PROMPTS)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.prompts()), d / "prompts.parquet")
    (d / "gate.json").write_text(json.dumps({"success": True}))
    (d / "params.yaml").write_text(yaml.safe_dump({"generate": {
        "backend": "vllm", "base_url": engine.base_url, "model": SERVED_NAME, "temperature": 0.0,
        "max_tokens": MAX_TOKENS, "concurrency": 4}}))
    argv = ["--params", str(d / "params.yaml"), "--prompts", str(d / "prompts.parquet"), "--gate",
            str(d / "gate.json"), "--out", str(d / "responses"), "--metrics", str(d / "metrics.json")]
    assert generate.main(argv) == 0
    return pq.read_table(d / "responses" / "responses.parquet"), pq.read_table(d / "prompts.parquet"), d


# ---------------------------------------------------------------- generate through vLLM

def test_the_served_prompt_ids_are_draftgates_rendering_and_the_truth_ids_are_kept(generated, smollm2_tok):
    from draftgate.reconstruct.core import Setup
    from draftgate.templates import get_template
    from reconstruct_fixtures import reconstruct_tables

    responses, prompts, _ = generated
    got = responses.to_pylist()
    assert [r["status"] for r in got] == ["ok"] * len(PROMPTS)
    assert all(r["truth_ids"] and r["prompt_token_ids"] for r in got)
    chatml = get_template("chatml")
    setup = Setup(smollm2_tok, chatml, {n: smollm2_tok.token_id(n) for n in chatml.special_names}, False)
    tokens, result, billing = reconstruct_tables(responses, prompts, setup)
    for row, r in zip(tokens.to_pylist(), got):
        # The stage's own check: a served prompt that differs from our rendering is quarantined
        # (prompt_ids_differ); none is, and the prompt part of input_ids is the served one.
        assert row["quarantine_reason"] is None, row
        assert row["input_ids"][:row["prompt_len"]] == r["prompt_token_ids"]
        assert (row["method"], row["completion_ids"]) == ("truth", r["truth_ids"])
    assert not result.counts["quarantine"]


def test_the_truth_ids_end_with_the_end_token_that_content_leaves_out_and_the_bill_counts_it(generated, smollm2_tok):
    from draftgate.serve.model import END_TOKEN

    end = smollm2_tok.token_id(END_TOKEN)
    got = generated[0].to_pylist()
    finishes = sorted(r["finish_reason"] for r in got)
    assert "stop" in finishes and "length" in finishes, finishes
    for r in got:
        assert r["billed_completion_tokens"] == len(r["truth_ids"])        # usage counts the end token
        assert r["billed_prompt_tokens"] == len(r["prompt_token_ids"])
        if r["finish_reason"] == "stop":
            assert r["truth_ids"][-1] == end and END_TOKEN not in r["content"]
            assert smollm2_tok.decode(r["truth_ids"][:-1]) == r["content"]
        else:
            assert len(r["truth_ids"]) == MAX_TOKENS and end not in r["truth_ids"]


def test_the_billing_convention_learned_from_the_engines_rows_is_counts_end(generated, smollm2_tok):
    from draftgate.reconstruct.core import Setup
    from draftgate.templates import get_template
    from reconstruct_fixtures import reconstruct_tables

    responses, prompts, _ = generated
    chatml = get_template("chatml")
    setup = Setup(smollm2_tok, chatml, {n: smollm2_tok.token_id(n) for n in chatml.special_names}, False)
    _, _, billing = reconstruct_tables(responses, prompts, setup)
    # The engine's rows carry the backend's name, the key reconstruct.billing declares vLLM under.
    assert {r["provider"] for r in responses.to_pylist()} == {"vllm"}
    ((name, conv),) = billing["by_provider"].items()
    assert name == "vllm"
    assert (conv["completion"], conv["completion_source"]) == ("counts_end", "learned")
    assert (conv["prompt_offset"], conv["prompt_source"]) == (0, "learned")
    assert billing["completion"]["row_agreement"] == 1.0 and not billing["disagreements"]


def test_the_engines_greedy_ids_are_our_models_greedy_ids(generated, lm):
    from draftgate.serve.model import Sampling, generate_batch

    got = generated[0].to_pylist()
    ours = generate_batch(lm, [r["prompt_token_ids"] for r in got], [Sampling(MAX_TOKENS)] * len(got))
    assert [g.ids for g in ours] == [r["truth_ids"] for r in got]


def test_the_request_hash_names_the_running_engine_and_a_rerun_sends_nothing(generated, engine, capsys):
    from stages import generate

    _, _, d = generated
    hashes = [r["request_hash"] for r in generated[0].to_pylist()]
    argv = ["--params", str(d / "params.yaml"), "--prompts", str(d / "prompts.parquet"), "--gate",
            str(d / "gate.json"), "--out", str(d / "responses"), "--metrics", str(d / "metrics.json")]
    assert generate.main(argv) == 0
    assert "0 sent this run" in capsys.readouterr().out
    assert [r["request_hash"] for r in pq.read_table(d / "responses" / "responses.parquet").to_pylist()] == hashes


def test_the_engine_we_start_names_the_local_servers_weights_tokenizer_and_template(lm):
    from draftgate.config import HiddenParams
    from draftgate.engine.target import served_model

    served = served_model(HiddenParams())
    assert served.path == model_dir()
    assert served.identity == {k: v for k, v in lm.identity.items() if k != "device"}


def test_a_missing_engine_environment_stops_the_stage_with_the_make_target(generated, tmp_path, capsys):
    from stages import generate

    _, _, d = generated
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "generate": {"backend": "vllm", "model": SERVED_NAME}, "engine": {"python": str(tmp_path / "no-python")}}))
    argv = ["--params", str(tmp_path / "params.yaml"), "--prompts", str(d / "prompts.parquet"), "--gate",
            str(d / "gate.json"), "--out", str(tmp_path / "out"), "--metrics", str(tmp_path / "m.json")]
    assert generate.main(argv) == 2
    assert "make engine" in capsys.readouterr().err


# ---------------------------------------------------------------- repair scores through vLLM

def test_vllms_raw_prompt_logprobs_equal_the_in_process_scorers(engine, lm):
    from draftgate.repair.score import HFScorer, Sampling, VllmScorer

    ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[1]}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"] + lm.tokenizer.encode("4")
    # Temperature 1, no nucleus: the raw log-probabilities are the answer on both sides.
    served = VllmScorer(engine.root_url, SERVED_NAME, Sampling(1.0)).score(ids, 1).logprobs
    ours = HFScorer(lm.model, Sampling(1.0)).score(ids, 1).logprobs
    # float32 on both sides, different kernels and thread counts (vLLM's CPU attention, torch's
    # sdpa under OMP_NUM_THREADS=1), and the kernels differ by CPU: 3.0e-5 at -13.8 seen on one
    # machine, 5.3e-6 by the run, 2.1e-5 at -1.82 on another (where 1e-5 failed, at every
    # commit). The bound is set by what the check is for: a wrong position or token is off by nats,
    # so 5e-4 is three orders of magnitude inside that and outside any CPU's rounding seen.
    assert len(served) == len(ours) and max(abs(a - b) for a, b in zip(served, ours)) < 5e-4


# ---------------------------------------------------------------- one engine prefill for repair and hidden

def tokens_row(pid: str, prompt: list[int], completion: list[int], bill: int) -> dict:
    return {"prompt_id": pid, "dataset": "code", "split": "train", "input_ids": prompt + completion,
            "prompt_len": len(prompt), "completion_ids": completion,
            "loss_mask": [0] * len(prompt) + [1] * len(completion), "method": "text",
            "n_completion": len(completion), "billed_completion_tokens": bill, "billing_convention": "counts_end",
            "billing_residual": len(completion) - bill, "quarantine_reason": None}


@pytest.fixture(scope="module")
def repaired(shared, lm, tmp_path_factory):
    """The repair stage with `repair.backend: vllm` (no base_url) and `hidden.backend: vllm` on two
    rows: "a", the model's " trans|pose" re-encoded canonically (repaired), and "b", written
    canonically (kept); then the hidden stage through vLLM with the prefill. The stage's engine
    start is the module's engine (its arguments kept and checked); the hidden stage starts its own
    offline engine for row a alone."""
    from draftgate.contract import vocab_table
    from draftgate.engine import launch
    from draftgate.repair.search import Vocab
    from draftgate.serve.model import smollm2_tokenizer
    from hidden_fixtures import metrics_of, write_gate, write_tokens
    from stages import repair
    from test_repair_search import TRANSPOSE, row

    root = shared.prefill.parent
    tok = smollm2_tokenizer()
    prompt, canon, truth = row(lm, Vocab.from_tokenizer(tok), TRANSPOSE)
    rows = [tokens_row("a", prompt, canon, len(truth)), tokens_row("b", prompt, truth[:20], 20)]
    write_tokens(root / "tokens.parquet", rows)
    pq.write_table(vocab_table(tok), root / "vocab.parquet")
    write_gate(root / "gate.json")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["repair"].update({"backend": "vllm", "base_url": None, "temperature": 0.7, "top_p": 1.0,
                             "min_confidence": 0.0})
    params["generate"]["temperature"] = 0.7                # the rows' sampler (the hidden gate's explained share)
    params["hidden"].update({"backend": "vllm", "mode": "offline", "device": "cpu", "threads": 1, "layers": None})
    params["engine"] = {**params.get("engine", {}), "python": str(engine_python())}
    params.setdefault("gates", {})["hidden"] = {**params["gates"].get("hidden", {}), "resample_rows": 2,
                                                "resample_seed": 0}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    params["hidden"]["backend"] = "in_process"
    (root / "in_process.yaml").write_text(yaml.safe_dump(params))
    started: dict = {}
    hits = prefix_cache_hits(shared.engine.root_url)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "running_vllm", standing_in(shared.engine, started))
        assert repair.main(["--params", str(root / "params.yaml"), "--tokens", str(root / "tokens.parquet"),
                            "--vocab", str(root / "vocab.parquet"), "--gate", str(root / "gate.json"),
                            "--out", str(root / "repaired" / "tokens.parquet"), "--prefill", str(shared.prefill),
                            "--metrics", str(root / "repair-metrics" / "repair.json")]) == 0
    hits = prefix_cache_hits(shared.engine.root_url) - hits
    out = run_hidden(root, "hidden", "params.yaml", "--prefill", str(shared.prefill))
    metrics = metrics_of(out)
    in_process = run_hidden(root, "in_process", "in_process.yaml")       # the reference: no engine, no prefill
    return {"root": root, "rows": rows, "truth": truth, "started": started, "hidden": out, "in_process": in_process,
            "tokens": root / "repaired" / "tokens.parquet", "params": root / "params.yaml",
            "table": pq.read_table(root / "repaired" / "tokens.parquet").to_pylist(),
            "repair_metrics": json.loads((root / "repair-metrics" / "repair.details.json").read_text()),
            "hidden_metrics": metrics, "prefix_cache_hits": hits}


def prefix_cache_hits(root_url: str) -> float:
    """The engine's prefix-cache hits so far, in tokens (its Prometheus counter)."""
    import urllib.request

    text = urllib.request.urlopen(f"{root_url}/metrics", timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


def run_hidden(root: Path, name: str, params: str, *more: str, code: int = 0) -> Path:
    """The hidden stage as dvc.yaml runs it: from its workspace, every path relative (the engine
    runs elsewhere: a relative path handed to it would name nothing)."""
    from stages import hidden

    here = os.getcwd()
    os.chdir(root)
    try:
        assert hidden.main(["--params", params, "--tokens", "repaired/tokens.parquet", "--gate", "gate.json",
                            "--out", name, "--metrics", f"{name}-metrics/hidden.json",
                            *(m.replace(f"{root}{os.sep}", "") for m in more)]) == code
    finally:
        os.chdir(here)
    return root / name


def in_process_features(lm, ids: list[int]):
    import torch

    from draftgate.target import capturing

    decoder = lm.model.get_decoder()
    with torch.inference_mode(), capturing(decoder, LAYERS, 1, len(ids), torch.bfloat16) as (aux, final):
        decoder(input_ids=torch.tensor([ids]))
    return aux[0], final[0]


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_a_repair_search_through_vllm_repairs_the_sampled_split_as_the_in_process_one_does(repaired):
    # test_repair_search's shortest row the model really sampled: in process, the search repairs
    # it to the sampled ids (test_repair_search). Through vLLM the trie nodes are one-token
    # generation requests (raw top-k logprobs of the next token), served from the prefix cache the
    # first pass filled: the row is not computed again for each node.
    a, b = repaired["table"]
    assert (a["repair_status"], a["method"], a["completion_ids"]) == ("repaired", "repaired", repaired["truth"])
    assert (b["repair_status"], b["repair_reason"]) == ("kept", "canonical")
    windows = repaired["repair_metrics"]["phases"]["windows"]["forwards"]
    # (Requests with prompt logprobs never read the cache: without the change both would be 0.)
    assert windows > 1 and repaired["prefix_cache_hits"] > 0


def test_the_repair_stage_starts_its_engine_with_the_hidden_capture_in_its_prefill_folder(repaired, shared):
    from draftgate.config import HiddenParams
    from draftgate.engine.target import served_model

    started = repaired["started"]
    assert started["model_dir"] == served_model(HiddenParams()).path
    flags = stage_args(shared.prefill)
    assert tuple(started["extra_args"][-len(flags):]) == flags and started["dtype"] == "float32"


def test_the_engines_first_pass_keeps_the_kept_rows_features_and_not_the_repaired_rows(repaired, shared, lm):
    from draftgate.prefill import open_prefill

    prefill, why = open_prefill(shared.prefill)
    assert why == "" and set(prefill.ids) == {"b"}
    assert prefill.key["backend"] == "vllm" and prefill.key["engine"].startswith("vllm")
    assert prefill.key["layers"] == list(LAYERS)
    b = repaired["table"][1]
    aux, final = prefill.features("b")
    ref_aux, ref_final = in_process_features(lm, b["input_ids"])
    assert aux.shape == ref_aux.shape and rel(aux, ref_aux) < 1e-3 and rel(final, ref_final) < 1e-3
    # The spool (a file per named first-pass request, none for the window requests) is gone.
    assert sorted(p.name for p in shared.prefill.iterdir()) == ["manifest.json", "shard-00000.safetensors"]
    m = repaired["repair_metrics"]
    assert (m["prefill_rows"], m["prefill_tokens"]) == (1, len(b["input_ids"])) and "prefill_skipped" not in m


def test_the_hidden_stage_copies_the_kept_row_and_sends_only_the_repaired_one_to_its_engine(repaired, lm):
    from draftgate.hidden.reader import OfflineFeatures

    m = repaired["hidden_metrics"]
    a, b = repaired["table"]
    assert (m["prefill_rows"], m["extracted_rows"]) == (1, 1)
    assert (m["prefill_tokens"], m["extracted_tokens"]) == (len(b["input_ids"]), len(a["input_ids"]))
    assert m["device"].startswith("vllm") and "prefill_unused" not in m
    stored = OfflineFeatures(repaired["hidden"], repaired["root"] / "repaired" / "tokens.parquet", verify_hashes=True)
    assert stored.prompt_ids == ["a", "b"]
    for r in (a, b):
        got = stored.get(r["prompt_id"])
        assert got.input_ids.tolist() == r["input_ids"]
        ref_aux, ref_final = in_process_features(lm, r["input_ids"])
        assert rel(got.aux, ref_aux) < 1e-3 and rel(got.final, ref_final) < 1e-3


# ---------------------------------------------------------------- the hidden stage through vLLM, and its gate
# (hidden.backend vllm: the stage's engine prefills row a, row b comes from repair's prefill; the
# in-process run of the same table is the reference; docs/engines.md, "Hidden states")

def hidden_gate(repaired, hidden_dir):
    from test_hidden_gate_files import run_hidden_gate

    return run_hidden_gate(hidden_dir, repaired["tokens"], repaired["params"])


def failed(result) -> set[str]:
    return {e["kwargs"].get("column", e["type"]) for e in result["expectations"] if not e["success"]}


def shards(out) -> dict:
    from safetensors import safe_open

    found = {}
    for path in sorted(out.glob("shard-*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            found[path.name] = ({k: f.get_tensor(k) for k in f.keys()}, f.metadata())
    return found


def feature_rows(out) -> list:
    """The stored rows, as the gate tests' writer takes them."""
    from test_hidden_gate_files import FeatureRow

    rows = []
    for tensors, meta in shards(out).values():
        offsets = tensors["row_offsets"].tolist()
        for k, pid in enumerate(json.loads(meta["prompt_ids"])):
            a, b = offsets[k], offsets[k + 1]
            rows.append(FeatureRow(pid, tensors["input_ids"][a:b].tolist(), tensors["loss_mask"][a:b].tolist(),
                                   tensors["aux"][a:b].clone(), tensors["final"][a:b].clone()))
    return rows


def corrupted(repaired, name: str, rows: list):
    import shutil

    from test_hidden_gate_files import write_hidden_dir

    out = repaired["root"] / name
    shutil.rmtree(out, ignore_errors=True)
    return write_hidden_dir(out, rows, repaired["tokens"])


def test_the_engine_writes_the_in_process_layout_with_the_tokens_ids_exactly(repaired):
    engine, ours = repaired["hidden"], repaired["in_process"]
    assert sorted(p.name for p in engine.iterdir()) == sorted(p.name for p in ours.iterdir())   # no spool left
    assert pq.read_table(engine / "index.parquet").equals(pq.read_table(ours / "index.parquet"))
    m_engine, m_ours = (json.loads((d / "manifest.json").read_text()) for d in (engine, ours))
    assert m_engine["backend"] == "vllm" and m_engine["engine"].startswith("vllm")
    same = ("format", "rows", "tokens", "tokens_sha256", "model", "tokenizer_fingerprint", "dtype", "layers",
            "final_state", "feature_bytes_per_token", "plan")
    assert {k: m_engine[k] for k in same} == {k: m_ours[k] for k in same}
    assert [(s["name"], s["rows"], s["tokens"], s["bytes"]) for s in m_engine["shards"]] == \
        [(s["name"], s["rows"], s["tokens"], s["bytes"]) for s in m_ours["shards"]]
    for (e, e_meta), (o, o_meta) in zip(shards(engine).values(), shards(ours).values()):
        assert e_meta == o_meta
        for key in ("input_ids", "loss_mask", "row_offsets"):
            assert e[key].equal(o[key]), key
        for key in ("aux", "final"):
            assert rel(e[key], o[key]) < 1e-3, key     # measured <= 5.1e-5: fp32 forwards, both rounded to bf16


def test_the_hidden_gate_passes_the_engines_shards(repaired):
    result = hidden_gate(repaired, repaired["hidden"])
    assert failed(result) == set(), json.dumps(result["expectations"], indent=1)[:3000]


def test_the_gate_fails_a_connector_that_puts_a_layer_in_anothers_slot(repaired):
    rows = feature_rows(repaired["hidden"])
    for r in rows:    # what a connector ignoring vLLM's ascending capture order stores for layers [14, 1, 26]
        r.aux = r.aux[:, [1, 0, 2]].contiguous()
    assert "reextraction_differs" in failed(hidden_gate(repaired, corrupted(repaired, "wrong_layer", rows)))


def test_the_gate_fails_a_connector_that_shifts_positions_by_one(repaired):
    import torch

    rows = feature_rows(repaired["hidden"])
    for r in rows:    # position t holds the state of t - 1 (a slot mapping one off)
        r.aux = torch.cat([r.aux[:1], r.aux[:-1]])
        r.final = torch.cat([r.final[:1], r.final[:-1]])
    assert {"sampled_explained_share", "reextraction_differs"} <= \
        failed(hidden_gate(repaired, corrupted(repaired, "shifted", rows)))


def test_a_rerun_resumes_every_shard_without_starting_the_engine(repaired, shared):
    from hidden_fixtures import metrics_of

    out = repaired["hidden"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    run_hidden(repaired["root"], "hidden", "params.yaml", "--prefill", str(shared.prefill))
    figures = metrics_of(out)
    assert figures["computed_shards"] == 0 and figures["extracted_tokens"] == 0
    assert figures["resumed_shards"] == repaired["hidden_metrics"]["computed_shards"] >= 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_missing_engine_environment_fails_the_hidden_stage_naming_the_python_and_the_fix(repaired, capsys):
    params = yaml.safe_load(repaired["params"].read_text())
    params["engine"] = {**params.get("engine", {}), "python": str(repaired["root"] / "no-such-python")}
    (repaired["root"] / "no_engine.yaml").write_text(yaml.safe_dump(params))
    out = run_hidden(repaired["root"], "no_engine", "no_engine.yaml", code=1)
    err = capsys.readouterr().err
    assert "no-such-python" in err and "vLLM" in err
    assert not (out / "manifest.json").exists()


def test_an_engine_whose_shutdown_fails_after_every_row_was_verified_is_noted_with_its_log_not_failed(tmp_path):
    from draftgate.hidden.vllm_backend import exit_note

    log = tmp_path / "engine.log"
    log.write_text("shard-00001 done\nRuntimeError: worker died during shutdown\n")
    assert exit_note(0, log) is None
    note = exit_note(-11, log)
    assert "exited with status -11 after every row was written and verified" in note
    assert note.endswith("RuntimeError: worker died during shutdown")     # the spool (and its log) goes next
    assert "was still running 30 s later and was stopped" in exit_note(None, log)


# ---------------------------------------------------------------- the template as the engine renders it

def contract_params(d: Path, engine, **generate) -> Path:
    """params.yaml with contract.engine vllm and generate pointing at the module's engine."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["contract"]["engine"] = "vllm"
    params["generate"].update({"backend": "vllm", "base_url": engine.base_url, "model": SERVED_NAME, **generate})
    (d / "params.yaml").write_text(yaml.safe_dump(params))
    return d / "params.yaml"


@pytest.fixture(scope="module")
def engine_contract(engine, tmp_path_factory):
    """The contract stage with contract.engine vllm against the running engine: (params, contract.json)."""
    from stages import contract

    d = tmp_path_factory.mktemp("contract")
    params = contract_params(d, engine)
    assert contract.main(["--params", str(params), "--out", str(d / "contract.json")]) == 0
    return params, d / "contract.json"


def template_gate(contract_json: Path, params: Path, d: Path) -> tuple[int, dict]:
    from stages import gate_template

    code = gate_template.main([str(REPO / "expectations" / "template.json"), str(contract_json), "--result",
                               str(d / "r.json"), "--params", str(params), "--no-docs"])
    return code, json.loads((d / "r.json").read_text())


def unexpected(record: dict, column: str) -> list:
    return next(e["unexpected_sample"] for e in record["expectations"] if e["kwargs"].get("column") == column)


def test_the_engine_renders_every_probe_our_code_template_renders_to_our_prompt_ids(engine_contract):
    doc = json.loads(engine_contract[1].read_text())
    tc = doc["template_contract"]
    asked = [p for p in doc["template_probes"] if "engine" in p]
    assert len(asked) == sum(p["code_text"] is not None for p in doc["template_probes"]) == tc["compared"] > 50
    # One probe spells <|im_end|> and <|im_start|> in its text: vLLM encodes the rendered prompt whole,
    # so they become the special ids, where draftgate keeps a message's text as text (docs/tokenizers.md).
    assert tc["engine_counts"] == {"asked": len(asked), "equal": len(asked) - 1, "special_text": 1, "differs": 0,
                                   "engine_refuses": 0}
    assert [p["probe"] for p in asked if p["engine"]["status"] == "special_text"] == ["special_token_text"]
    assert tc["engine"]["version"].startswith("0.32") and tc["engine"]["model"] == SERVED_NAME and tc["ok"]


def test_the_template_gate_passes_the_engines_rendering_with_our_ids_encoded_again(engine_contract, tmp_path):
    code, record = template_gate(engine_contract[1], engine_contract[0], tmp_path)
    assert code == 0
    statuses = record["computed"]["report"]["engine"]["statuses"]
    assert statuses["differs"] == statuses["not_asked"] == statuses["engine_refuses"] == 0 and statuses["equal"] > 50


def test_a_code_template_with_another_separator_fails_against_the_engine_naming_the_probe_and_token(
        engine, engine_contract, tmp_path, monkeypatch, capsys):
    from draftgate.templates import TEMPLATES, ChatMLTemplate, Text
    from stages import contract

    class Colon(ChatMLTemplate):      # "assistant:\n" opens the reply: one character off the served template
        def render_prompt(self, messages, tools, thinking):
            return super().render_prompt(messages, tools, thinking)[:-1] + [Text("assistant:\n")]

    monkeypatch.setitem(TEMPLATES, "chatml", Colon)
    params, stored = engine_contract
    # The gate encodes our side again from the stored conversations: the stage's renders are the
    # honest ones, yet the edited code template fails, at the token where the reply opens.
    code, record = template_gate(stored, params, tmp_path)
    assert code == 1
    engine_ids = {p["probe"]: p["engine"]["ids"] for p in json.loads(stored.read_text())["template_probes"] if "engine" in p}
    sample = unexpected(record, "differs")
    assert sample and all("the engine's prompt ids and ours differ from token" in v for v in sample)
    for v in sample:
        probe, token = v.split(" (thinking ")[0], int(v.rsplit(" ", 1)[1])
        assert token == len(engine_ids[probe]) - 1      # [... <|im_start|> assistant ⟦\n⟧]
    # The stage itself, against the running engine, fails too and names each probe through the engine.
    d = tmp_path / "stage"
    d.mkdir()
    assert contract.main(["--params", str(contract_params(d, engine)), "--out", str(d / "c.json")]) == 1
    err = capsys.readouterr().err
    assert "FAIL template probe 'special_token_text' (thinking off) through the engine: its prompt ids and ours differ" in err


def test_the_gate_compares_the_stored_engine_ids_never_the_stages_verdict(engine_contract, tmp_path):
    params, stored = engine_contract
    doc = json.loads(stored.read_text())
    probe = next(p for p in doc["template_probes"] if p.get("engine", {}).get("status") == "equal")
    probe["engine"]["ids"][3] += 1          # an engine that served another id; the stage's "equal" left as written
    (tmp_path / "contract.json").write_text(json.dumps(doc))
    code, record = template_gate(tmp_path / "contract.json", params, tmp_path)
    assert code == 1
    assert unexpected(record, "differs") == [
        f"{probe['probe']} (thinking {str(probe['thinking']).lower()}): the engine's prompt ids and ours differ from token 3"]


def standing_in(engine, started: dict):
    """running_vllm's stand-in: the module's engine instead of a new start (20-40 s), its arguments kept."""
    @contextlib.contextmanager
    def running(model_dir, **kwargs):
        started.update(kwargs, model_dir=model_dir)
        yield engine
    return running


def test_a_contract_that_starts_its_engine_passes_the_scale_out_flag_and_names_the_weights(engine, tmp_path,
                                                                                            monkeypatch):
    from draftgate.config import HiddenParams
    from draftgate.engine import launch
    from draftgate.engine.target import served_model
    from stages import contract

    started = {}
    monkeypatch.setattr(launch, "running_vllm", standing_in(engine, started))
    params = contract_params(tmp_path, engine, backend="local", base_url=None)
    assert contract.main(["--params", str(params), "--out", str(tmp_path / "c.json")]) == 0
    assert started["model_dir"] == model_dir() and SCALE_OUT_FLAG in started["extra_args"]
    identity = json.loads((tmp_path / "c.json").read_text())["template_contract"]["engine"]
    assert {k: identity[k] for k in ("weights", "tokenizer", "chat_template")} == served_model(HiddenParams()).identity


def test_the_hidden_stage_proves_the_responses_of_a_vllm_draftgate_started_came_from_its_weights(
        engine, generated, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from draftgate.config import HiddenParams, load_params
    from draftgate.engine import launch
    from draftgate.hidden.run import _served
    from draftgate.target import check_served, describe_target
    from stages import generate

    monkeypatch.setattr(launch, "running_vllm", standing_in(engine, {}))
    _, _, d = generated
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"generate": {
        "backend": "vllm", "base_url": None, "model": SERVED_NAME, "temperature": 0.0, "max_tokens": 4}}))
    argv = ["--params", str(tmp_path / "params.yaml"), "--prompts", str(d / "prompts.parquet"), "--gate",
            str(d / "gate.json"), "--out", str(tmp_path / "responses"), "--metrics", str(tmp_path / "metrics.json")]
    assert generate.main(argv) == 0
    params = load_params(tmp_path / "params.yaml")
    request = SimpleNamespace(responses=tmp_path / "responses" / "responses.parquet", prompts=d / "prompts.parquet")
    target = describe_target(HiddenParams())
    assert _served(request, params, target, check_served) == {"checked": len(PROMPTS), "legacy": 0}
    # The same rows from a vLLM at a base_url name what it reports, not weights: nothing to prove.
    at_url = load_params(d / "params.yaml")
    assert _served(request, at_url, target, check_served)["checked"] == 0


# ---------------------------------------------------------------- the launcher

def test_an_engine_that_dies_before_it_is_ready_names_its_log_file(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no module named vllm (a broken environment)' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(EngineError, match=r"exited with code 3 .*its log .*engine\.log ends with:\n.*no module named vllm"):
        with running_vllm(model_dir(), python=fake, device="cpu", log_path=tmp_path / "engine.log", timeout_s=60):
            pass
    with pytest.raises(EngineError, match="make engine"):
        with running_vllm(model_dir(), python=tmp_path / "absent", device="cpu"):
            pass


def test_a_parent_killed_with_sigkill_leaves_no_engine_behind(tmp_path):
    # A stand-in engine that never answers (a shell that sleeps): the parent dies waiting for it;
    # the watchdog must take the whole process group (the sleeper and its own child) down.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nsleep 300 &\nsleep 300\n")
    fake.chmod(0o755)
    script = (f"from draftgate.engine.launch import running_vllm\nimport pathlib\n"
              f"with running_vllm(pathlib.Path({str(model_dir())!r}), python={str(fake)!r}, device='cpu', "
              f"log_path={str(tmp_path / 'log')!r}, timeout_s=300, stop_grace_s=2):\n    pass\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 60
    pgid = None
    while time.monotonic() < deadline and pgid is None:
        pgid = next((int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _cmd(p).startswith(f"/bin/sh {fake} ")),
                    None)
        time.sleep(0.1)
    assert pgid is not None, "the stand-in engine never started"
    assert len(group_members(pgid)) >= 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(pgid) == []


def _cmd(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_an_exception_in_the_block_stops_the_whole_process_group_and_frees_the_port(shared):
    # Last in the file: it ends the module's engine the way a failing stage would.
    engine = shared.engine
    port = int(engine.base_url.rsplit(":", 1)[1].split("/")[0])
    members = group_members(engine.pid)
    assert engine.pid in members and len(members) >= 2      # the API server and its engine core
    assert shared.exit(RuntimeError("a stage failed mid-run")) is False   # re-raised, not swallowed
    assert group_members(engine.pid) == []
    assert all(not Path(f"/proc/{pid}").exists() or _state(pid) == "Z" for pid in members)
    with socket.socket() as s:     # a new server can listen on the engine's port (closed
        # connections may sit in TIME_WAIT there: servers, vLLM's included, bind with SO_REUSEADDR)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2]
    except OSError:
        return "gone"
