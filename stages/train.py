"""DVC stage: hidden-state features -> draft vocabulary, trained EAGLE-3 drafter, two exports.

Refuses to run unless the hidden-state gate passed. Writes data/drafter/{sglang,speculators}
(the layouts SGLang and vLLM load), data/drafter/vocab.safetensors (the map and the hash of the
data it came from), the loss and per-step accuracy curves (DVC plots) and metrics/train.json.
Under `torchrun --nproc-per-node N -m stages.train ...` it trains data-parallel; rank 0 writes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.train", description=__doc__)
    p.add_argument("--params", required=True, type=Path)
    p.add_argument("--hidden", required=True, type=Path, help="the hidden stage's folder (manifest.json)")
    p.add_argument("--tokens", required=True, type=Path, help="tokens.parquet")
    p.add_argument("--gate", required=True, type=Path, help="the hidden gate's metric JSON")
    p.add_argument("--composition-gate", type=Path, default=None,
                   help="the composition gate's metric JSON: the training set covers the served modes")
    p.add_argument("--out", required=True, type=Path, help="output folder: sglang/, speculators/, vocab.safetensors")
    p.add_argument("--checkpoint", required=True, type=Path, help="checkpoint folder (resume)")
    p.add_argument("--metrics", required=True, type=Path)
    p.add_argument("--loss-plot", required=True, type=Path)
    p.add_argument("--acc-plot", required=True, type=Path)
    p.add_argument("--stop-after", type=int, default=None,
                   help="leave after N optimizer steps with a checkpoint written (as a crash would)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.drafter.run import RunError, run
    from draftgate.gates.result import GateNotPassed, require_passed

    try:
        params = load_params(args.params)
        require_passed(args.gate, "gate_hidden", "fix the hidden-state features before training on them")
        if args.composition_gate is not None:
            require_passed(args.composition_gate, "gate_composition", "cover every served mode (serving.modes) "
                           "in the training set, or serve fewer modes, before training")
        result = run(params, hidden_dir=args.hidden, tokens_path=args.tokens, out=args.out,
                     checkpoint=args.checkpoint, stop_after=args.stop_after)
    except (ParamsError, GateNotPassed, RunError) as e:
        print(f"train: {e}", file=sys.stderr)
        return 1
    if result is not None:        # rank 0 of a finished run
        write(result, out=args.out, checkpoint=args.checkpoint, metrics=args.metrics,
              loss_plot=args.loss_plot, acc_plot=args.acc_plot)
    return 0


def write(result, *, out: Path, checkpoint: Path, metrics: Path, loss_plot: Path, acc_plot: Path) -> None:
    """The curves (DVC plots), the metrics, then the checkpoint removed: the run is complete and
    exported, its checkpoint only served a crash, and left behind it would make the next run on
    changed data refuse to start."""
    from draftgate.drafter.train import write_curve

    write_curve(result.curve, loss_plot, acc_plot, result.ttt_steps)
    # The curve also travels with the artifact (DVC-cached, versioned with the weights): the
    # drafter gate reads it from there; plots/ is for display.
    shutil.copyfile(loss_plot, out / "loss_curve.json")
    result.metrics.write(metrics)
    shutil.rmtree(checkpoint, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
