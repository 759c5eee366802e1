"""The repair gate's check: are the stage's confidences the share of its repaired rows that come out
exact? Recomputed from the ids before and after repair and the backend's own ids (truth_ids).

`repair_confidence` is the stage's claim about each repaired row: the target's posterior that its
split is the one sampled, a low estimate (unscored windows at their bound) beside a high one
(`repair_confidence_hi`, scored windows only). Where the backend returned its ids, the claim can be
checked. The rows it is checked on are chosen WITHOUT the truth's outcome: every row whose
completion ids differ from the tokens table's (repaired, read from the ids, not from `method`) and
whose truth spells the same bytes (the posterior is over splits of those bytes). Choosing them
by the outcome (only rows whose text ids differed from the truth) would leave out every exact row
the stage broke, and the count would err high.

On those n rows, made exact = the repaired ids equal the truth, counted here. The number the
confidences predict is a sum of independent Bernoulli(p_i): a Poisson-binomial, whose exact
distribution is a convolution (`poisson_binomial`, O(n^2)). The interval is central at
gates.repair.calibration_level (L): its low end is the (1 - L)/2 quantile under the LOW estimates,
its high end the (1 + L)/2 quantile under the HIGH ones. Where the truth lies between the two
estimates, as the search's construction says it must, a calibrated stage falls outside with
probability at most 1 - L.

Also measured (reported; the suite judges only the interval): precision at repair.min_confidence,
the share exact among those rows with confidence >= it, with a Wilson 95% interval, and its
coverage, the share of the differing rows (text ids not the truth, same bytes) that it keeps
repaired; the confidences in tenths (rows, mean, made exact where graded); `expected_made_exact`
(the sum of the low estimates over every repaired row), which a text-only run has without truth;
and the rows whose search the stage says search_tokens cut (`repair_capped`): only the stage can
know that, so it is reported and never makes a check pass.

`compute(inputs, params_path)` (handed to the engine by stages/gate_repair.py) returns the one-row
table `calibration` for the view, and the same figures with `confidence_tenths` in the gate's
record (`computed.report.tables`), which the gate's page shows.
"""

from __future__ import annotations

import math
from typing import Sequence

from draftgate.gates.compute import Computed
from draftgate.gates.suite import GateError

NEEDS = {"repair": "data/repair/tokens.parquet", "before": "data/tokens/tokens.parquet",
         "responses": "data/responses/responses.parquet", "vocab": "data/contract/vocab.parquet"}


def poisson_binomial(p: Sequence[float]) -> list[float]:
    """P(count = k), k = 0..n, for independent events of probabilities p: one convolution per event."""
    dist = [1.0]
    for q in p:
        q = min(1.0, max(0.0, q))
        nxt = [0.0] * (len(dist) + 1)
        for k, v in enumerate(dist):
            nxt[k] += v * (1 - q)
            nxt[k + 1] += v * q
        dist = nxt
    return dist


def quantile(dist: Sequence[float], level: float) -> int:
    """The smallest k with P(count <= k) >= level (a 1e-12 slack for the sums' rounding)."""
    acc = 0.0
    for k, v in enumerate(dist):
        acc += v
        if acc >= level - 1e-12:
            return k
    return len(dist) - 1


def interval(low: Sequence[float], high: Sequence[float], level: float) -> tuple[int, int]:
    """The count's central interval at `level`: the lower tail under the low estimates, the upper
    tail under the high ones."""
    tail = (1 - level) / 2
    return quantile(poisson_binomial(low), tail), quantile(poisson_binomial(high), 1 - tail)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval for k successes in n (95% at z 1.96); (0, 1) for no trials."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def _read(inputs: dict[str, str]) -> tuple[list[dict], dict, dict, list[bytes]]:
    import pyarrow.parquet as pq

    missing = [n for n in NEEDS if n not in inputs]
    if missing:
        raise GateError("the repair gate's check reads " + ", ".join(f"{n}= ({NEEDS[n]})" for n in missing)
                        + f"; given: {', '.join(sorted(inputs))}; add them as --input NAME=PATH (dvc.yaml gate_repair)")
    cols = ["prompt_id", "completion_ids", "repair_confidence", "repair_confidence_hi", "repair_capped"]
    try:
        after = pq.read_table(inputs["repair"], columns=cols).to_pylist()
        before = pq.read_table(inputs["before"], columns=["prompt_id", "completion_ids"]).to_pydict()
        resp = pq.read_table(inputs["responses"], columns=["prompt_id", "truth_ids"]).to_pydict()
        vocab = pq.read_table(inputs["vocab"], columns=["id", "hex"]).to_pydict()
    except (OSError, KeyError, ValueError) as e:     # a missing file or column: which, and the fix
        raise GateError(f"the repair gate's check cannot read its inputs ({e}); rerun the stage that writes it "
                        "(dvc repro repair: repair_confidence_hi and repair_capped are its columns)") from None
    pieces: list[bytes] = [b""] * len(vocab["id"])
    for i, h in zip(vocab["id"], vocab["hex"]):
        pieces[i] = bytes.fromhex(h)
    return (after, dict(zip(before["prompt_id"], before["completion_ids"])),
            {p: t for p, t in zip(resp["prompt_id"], resp["truth_ids"]) if t is not None}, pieces)


def calibrate(after: list[dict], before: dict, truth: dict, pieces: list[bytes], level: float,
              threshold: float) -> tuple[dict, list[dict]]:
    """(the figures, the tenths table) from the rows: see the module docstring."""
    spell = lambda ids: b"".join(pieces[i] for i in ids)      # noqa: E731
    repaired, graded, differing = [], [], 0
    for r in after:
        was = before.get(r["prompt_id"])
        t = truth.get(r["prompt_id"])
        changed = was is not None and r["completion_ids"] != was
        same_bytes = t is not None and was is not None and spell(t) == spell(was)
        differing += same_bytes and was != t
        if changed:
            low = r["repair_confidence"] if r["repair_confidence"] is not None else 0.0
            high = r["repair_confidence_hi"] if r["repair_confidence_hi"] is not None else low
            row = {"low": low, "high": max(low, high), "exact": r["completion_ids"] == t,
                   "graded": same_bytes, "differed": same_bytes and was != t}
            repaired.append(row)
            if same_bytes:
                graded.append(row)
    n, observed = len(graded), sum(g["exact"] for g in graded)
    lo, hi = interval([g["low"] for g in graded], [g["high"] for g in graded], level) if n else (0, 0)
    kept = [g for g in graded if g["low"] >= threshold]
    k = sum(g["exact"] for g in kept)
    p_lo, p_hi = wilson(k, len(kept))
    figures = {
        "repaired_rows": len(repaired),
        "capped_rows": sum(bool(r["repair_capped"]) for r in after),   # the stage's own word: reported only
        "expected_made_exact": round(sum(r["low"] for r in repaired), 3),
        "expected_made_exact_high": round(sum(r["high"] for r in repaired), 3),
        "graded_rows": n,
        "made_exact_observed": observed,
        "made_exact_interval_low": lo,
        "made_exact_interval_high": hi,
        "calibration_level": level,
        # How far the observed count lies outside the interval (0: inside, or nothing to grade).
        "calibration_miss": max(0, lo - observed, observed - hi) if n else 0,
        "graded_expected_low": round(sum(g["low"] for g in graded), 3),
        "graded_expected_high": round(sum(g["high"] for g in graded), 3),
        "min_confidence": threshold,
        "kept_at_min_confidence": len(kept),
        "precision_at_min_confidence": round(k / len(kept), 4) if kept else None,
        "precision_ci95_low": round(p_lo, 4) if kept else None,
        "precision_ci95_high": round(p_hi, 4) if kept else None,
        "differing_rows": differing,
        "coverage_at_min_confidence": round(sum(g["differed"] for g in kept) / differing, 4) if differing else None,
    }
    tenths = []
    for b in range(10):
        rows = [r for r in repaired if min(9, int(r["low"] * 10)) == b]
        done = [r for r in rows if r["graded"]]
        tenths.append({"confidence": f"{b / 10:.1f}-{(b + 1) / 10:.1f}", "repaired_rows": len(rows),
                       "mean_confidence": round(sum(r["low"] for r in rows) / len(rows), 3) if rows else None,
                       "graded_rows": len(done), "made_exact": sum(r["exact"] for r in done)})
    return figures, tenths


def _params(params_path: str) -> tuple[float, float]:
    from draftgate.config import ParamsError, load_params

    try:
        params = load_params(params_path)
    except ParamsError as e:
        raise GateError(f"{params_path}: {e}") from None
    return params.gates.repair.calibration_level, params.repair.min_confidence


CALIBRATION_NOTE = ("repaired rows (ids changed) whose truth spells the same bytes; made exact counted from the ids; "
                    "the interval: the (1-L)/2 quantile of the Poisson-binomial of the low confidences to the (1+L)/2 "
                    "quantile of the high ones; precision at repair.min_confidence with a Wilson 95% interval; "
                    "coverage: the differing rows it keeps repaired; capped_rows: the stage's repair_capped (reported only)")
TENTHS_NOTE = "every repaired row by its confidence (low estimate); made exact where the backend returned its ids"


def compute(inputs: dict[str, str], params_path: str) -> Computed:
    import pyarrow as pa

    level, threshold = _params(params_path)
    figures, tenths = calibrate(*_read(inputs), level=level, threshold=threshold)
    # Counts as integers, the rest (shares, nulls where nothing was kept) as doubles.
    schema = pa.schema([(k, pa.int64() if isinstance(v, int) and not isinstance(v, bool) else pa.float64())
                        for k, v in figures.items()])
    table = pa.Table.from_pylist([figures], schema=schema)
    report = {"calibration": figures, "tables": {
        # One figure a line: fourteen columns of one row scrolled sideways on the page.
        "calibration": {"note": CALIBRATION_NOTE, "columns": ["figure", "value"],
                        "rows": [{"figure": k, "value": v} for k, v in figures.items()]},
        "confidence_tenths": {"note": TENTHS_NOTE, "columns": list(tenths[0]), "rows": tenths}}}
    return Computed(tables={"calibration": table}, report=report)
