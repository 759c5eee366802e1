"""Shared by the drafter tests: real SmolLM2 features of a few real token rows, on disk.

A workspace holds what the train stage reads in the pipeline: tokens.parquet (ChatML rows
tokenised by the real SmolLM2 tokenizer, tests/hidden_fixtures.py), the hidden stage's offline
shards made by that stage itself from the real target, passed-gate files and a params.yaml with a
tiny training run (small draft vocabulary, 3 TTT steps, CPU).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hidden_fixtures import token_rows, write_gate, write_tokens

TINY = {"draft_vocab_size": 96, "ttt_steps": 3, "ttt_decay": 0.8, "epochs": 6, "batch_tokens": 256,
        "lr": 0.003, "warmup_fraction": 0.0, "checkpoint_every": 2, "device": "cpu",
        "export_dtype": "float32", "seed": 0, "threads": 1}   # 1: the suite's OMP_NUM_THREADS


@dataclass
class Workspace:
    root: Path
    tokens: Path
    hidden: Path
    gate: Path
    mode: str = "offline"

    def params(self, name: str = "params.yaml", **drafter) -> Path:
        path = self.root / name
        data = {"hidden": {"device": "cpu", "check_served": False, "shard_max_mb": 1.0, "mode": self.mode},
                "drafter": {**TINY, **drafter}, "gates": {"drafter": {"min_loss_drop": 1.2, "loss_window": 3}}}
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return path

    def stage_args(self, params: Path, out: Path) -> list[str]:
        return ["--params", str(params), "--hidden", str(self.hidden), "--tokens", str(self.tokens),
                "--gate", str(self.gate), "--out", str(out / "drafter"), "--checkpoint", str(out / "ckpt"),
                "--metrics", str(out / "metrics" / "train.json"), "--loss-plot", str(out / "train_loss.json"),
                "--acc-plot", str(out / "train_acc.json")]


def make_workspace(root: Path, n_rows: int = 8, mode: str = "offline") -> Workspace:
    from draftgate.config import TokenizerParams
    from draftgate.tokenizers import load_tokenizer
    from stages.hidden import main as hidden_main

    root.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(TokenizerParams(kind="smollm2"))
    tokens = write_tokens(root / "tokens.parquet", token_rows(tok, n_rows))
    ws = Workspace(root, tokens, root / "hidden", write_gate(root / "gate_hidden.json"), mode)
    params = ws.params("hidden_params.yaml")
    write_gate(root / "gate_tokens.json")
    rc = hidden_main(["--params", str(params), "--tokens", str(tokens), "--gate", str(root / "gate_tokens.json"),
                      "--out", str(ws.hidden), "--metrics", str(root / "hidden_metrics" / "hidden.json")])
    assert rc == 0, "the hidden stage could not make the fixture's features"
    return ws


def curve(path: Path) -> list[dict]:
    return [{k: float(v) for k, v in r.items()} for r in json.loads(path.read_text())]


def metrics(out: Path) -> dict:
    # The details: everything, the run's own figures (world_size, a resumed step) too (draftgate/metrics.py).
    return json.loads((out / "metrics" / "train.details.json").read_text())


_CACHE: dict = {}


def shared_workspace(tmp_path_factory, name: str = "drafter_ws", n_rows: int = 8, mode: str = "offline") -> Workspace:
    """One workspace per test session, row count and mode: the hidden stage runs once."""
    key = (name, n_rows, mode)
    if key not in _CACHE:
        _CACHE[key] = make_workspace(tmp_path_factory.getbasetemp() / name, n_rows, mode)
    return _CACHE[key]


def shared_target():
    """The real SmolLM2 target on CPU, loaded once per session."""
    if "target" not in _CACHE:
        from draftgate.config import HiddenParams
        from draftgate.target import load_target

        _CACHE["target"] = load_target(HiddenParams(device="cpu"), device="cpu")
    return _CACHE["target"]


def shared_trained(ws: Workspace, tmp_path_factory, epochs: int = 3) -> Path:
    """One trained drafter per session and workspace (its exports under `<out>/drafter`), for tests
    that only read it or copy it before they change it."""
    key = ("trained", ws.hidden, epochs)
    if key not in _CACHE:
        out = tmp_path_factory.mktemp(f"trained_{epochs}")
        assert train_into(ws, out, ws.params(epochs=epochs)) == 0
        _CACHE[key] = out
    return _CACHE[key]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The session's shared workspace, as a fixture for the test modules that import it."""
    return shared_workspace(tmp_path_factory)


@pytest.fixture(scope="module")
def trained(ws, tmp_path_factory):
    """The session's shared trained drafter on `ws`, as a fixture."""
    return shared_trained(ws, tmp_path_factory)


def run_drafter_gate(ws: Workspace, trained: Path, tmp: Path, sglang: Path | None = None,
                     speculators: Path | None = None) -> tuple[int, set, dict]:
    """The drafter gate as dvc.yaml runs it (its stage, which hands the engine the drafter check) on
    `trained`'s exports, or on the layouts given: (exit code, failed checks, the result)."""
    import json

    from stages.gate_drafter import main as validate

    params = ws.params("gate.yaml", epochs=3)
    suite = Path(__file__).resolve().parents[1] / "expectations" / "drafter.json"
    rc = validate([str(suite), str((sglang or trained / "drafter" / "sglang") / "config.json"),
                   "--input", f"speculators={(speculators or trained / 'drafter' / 'speculators') / 'config.json'}",
                   "--input", f"hidden={ws.hidden}", "--input", f"tokens={ws.tokens}",
                   "--input", f"loss={trained / 'drafter' / 'loss_curve.json'}",
                   "--params", str(params), "--no-docs", "--result", str(tmp / "result.json")])
    result = json.loads((tmp / "result.json").read_text())
    failed = {e["kwargs"].get("column", e["type"]) for e in result.get("expectations", []) if not e["success"]}
    assert rc in (0, 1), result.get("error")
    return rc, failed, result


def train_into(ws: Workspace, out: Path, params: Path, **kw) -> int:
    """The train stage with the shared target: draftgate/drafter/run.py's run, then what
    stages/train.py writes of it (the gate's verdict is the stage's check, tested there)."""
    from draftgate.config import load_params
    from draftgate.drafter.run import run
    from stages.train import write

    a = ws.stage_args(params, out)
    drafter = Path(a[a.index("--out") + 1])
    result = run(load_params(params), hidden_dir=ws.hidden, tokens_path=ws.tokens, out=drafter,
                 checkpoint=out / "ckpt", target=shared_target(), **kw)
    if result is not None:
        write(result, out=drafter, checkpoint=out / "ckpt", metrics=out / "metrics" / "train.json",
              loss_plot=out / "train_loss.json", acc_plot=out / "train_acc.json")
    return 0
