"""Billing settled over the whole tokens table, after the rows are reconstructed.

A billing convention is a property of the provider, so it is learned (or taken as declared)
once over every row, not per chunk. While the chunks stream past, `BillingFacts` keeps per row
only the ~35 bytes billing needs (numpy: provider code, lengths, bills, flags; `chunk_facts`,
made wherever the chunk was reconstructed, in a worker process or not); `settle` then finds
each provider's conventions (billing.settle_columns), every row's residuals and the summary,
and marks billing mismatches for quarantine when asked; `with_settled` writes those
columns into a slice of the table on the second pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftgate.reconstruct import billing
from draftgate.reconstruct.core import EXAMPLES, PROMPT_EXACT, Result

# The per-row facts, in billing.Columns' argument order; `*_known`: where the nullable value exists.
FACTS = ("provider_code", "completion_len", "completion_len_known", "billed_completion", "billed_completion_known",
         "prompt_len", "prompt_len_known", "billed_prompt", "billed_prompt_known", "ends_with_eos",
         "completion_exact", "quarantined", "prompt_exact")
FLAGS = frozenset(f for f in FACTS if f.endswith("_known")) | {"ends_with_eos", "completion_exact", "quarantined",
                                                                "prompt_exact"}


@dataclass
class ChunkFacts:
    """One chunk's facts (`chunk_facts`): made where the chunk is reconstructed, a worker process
    or not, and added to BillingFacts in chunk order."""
    providers: list[str]        # provider keys in order of first sight in the chunk
    columns: dict[str, Any]     # FACTS -> numpy array; provider_code indexes `providers`


def chunk_facts(rows: list[dict]) -> ChunkFacts:
    import numpy as np

    providers: dict[str, int] = {}
    codes = [providers.setdefault(billing.provider_key(r["provider"]), len(providers)) for r in rows]
    return ChunkFacts(list(providers), {
        "provider_code": np.array(codes, dtype=np.int32),
        **_ints(rows, "n_completion", "completion_len"),
        **_ints(rows, "billed_completion_tokens", "billed_completion"),
        **_ints(rows, "prompt_len", "prompt_len"), **_ints(rows, "billed_prompt_tokens", "billed_prompt"),
        "ends_with_eos": np.array([bool(r["ends_with_eos"]) for r in rows], dtype=bool),
        "completion_exact": np.array([r["method"] in ("truth", "logprobs") for r in rows], dtype=bool),
        "quarantined": np.array([r["quarantine_reason"] is not None for r in rows], dtype=bool),
        "prompt_exact": np.array([bool(r.get(PROMPT_EXACT)) for r in rows], dtype=bool),
    })


class BillingFacts:
    """What billing needs of every reconstructed row, gathered chunk by chunk."""

    def __init__(self) -> None:
        self.providers: dict[str, int] = {}     # provider key -> code, in order of first sight
        self.chunks: list[dict[str, Any]] = []

    def add(self, chunk: ChunkFacts) -> None:
        """The next chunk's facts, its provider codes renumbered to the table's: a code per key in
        order of first sight over the chunks so far, as if every row were seen here."""
        import numpy as np

        codes = np.array([self.providers.setdefault(k, len(self.providers)) for k in chunk.providers],
                         dtype=np.int32)
        self.chunks.append({**chunk.columns, "provider_code": codes[chunk.columns["provider_code"]]})

    def take(self) -> dict[str, Any]:
        """Every row's facts as one array per fact (and the chunks let go)."""
        import numpy as np

        if not self.chunks:
            return {k: np.zeros(0, dtype=bool if k in FLAGS else np.int64) for k in FACTS}
        out = {k: np.concatenate([c[k] for c in self.chunks]) for k in FACTS}
        self.chunks = []
        return out


@dataclass
class Settled:
    columns: dict[str, Any]         # the four billing columns of the tokens table, one Arrow array each
    mismatched: Any                 # per row: quarantined for a billing mismatch (numpy bool)
    examples: list[tuple[int, str]]  # (row, detail) of the first mismatches, for review


def settle(facts: BillingFacts, params: Any, on_mismatch: str, total: Result) -> tuple[Settled, dict]:
    """Conventions (declared, or learned from exact rows), every row's residuals, the summary.
    On `on_mismatch == "quarantine"`, rows whose bill disagrees are marked (counted in `total`)."""
    import numpy as np
    import pyarrow as pa

    keys = list(facts.providers)
    f = facts.take()
    measured = f["completion_len_known"]
    graded = measured & ~f["quarantined"]

    def columns(rows: Any) -> billing.Columns:
        return billing.Columns(
            keys, f["provider_code"], f["completion_len"], f["billed_completion"], f["billed_completion_known"] & rows,
            f["ends_with_eos"], f["completion_exact"], f["prompt_len"], f["prompt_len_known"] & rows,
            f["billed_prompt"], f["billed_prompt_known"], f["prompt_exact"])
    graded_cols = columns(graded)
    conventions = billing.settle_columns(graded_cols, params.completion, params.prompt)
    summary = billing.summary_columns(graded_cols, conventions)
    # Residuals for every reconstructed row (quarantined ones too, as diagnostics).
    every = columns(measured)
    completion_residual, completion_known = every.completion_residuals(conventions)
    prompt_residual, prompt_known = every.prompt_residuals(conventions)
    has_convention = np.array([k in conventions for k in keys] + [False], dtype=bool)[f["provider_code"]] & measured
    # Per provider, then taken per row by code in Arrow: no Python object per row.
    code = pa.array(f["provider_code"], pa.int32(), mask=~has_convention)
    convention = pa.array([conventions[k].completion if k in conventions else None for k in keys] + [None],
                          pa.string()).take(code)
    prompt_offset = pa.array([conventions[k].prompt_offset if k in conventions else None for k in keys] + [None],
                             pa.int32()).take(code)
    del code
    mismatched = np.zeros(len(has_convention), dtype=bool)
    examples: list[tuple[int, str]] = []
    if on_mismatch == "quarantine":
        mismatched = graded & ((completion_known & (completion_residual != 0)) |
                               (prompt_known & (prompt_residual != 0)))
        if mismatched.any():
            total.counts["quarantine"]["billing_mismatch"] += int(mismatched.sum())
        room = EXAMPLES - len(total.examples["billing_mismatch"])
        examples = [(int(i), f"completion residual {int(completion_residual[i]) if completion_known[i] else None}, "
                             f"prompt residual {int(prompt_residual[i]) if prompt_known[i] else None}")
                    for i in np.flatnonzero(mismatched)[:max(room, 0)]]
    return Settled({
        "billing_convention": convention,
        "billing_residual": pa.array(completion_residual, pa.int64(), mask=~(completion_known & has_convention)),
        "prompt_billing_offset": prompt_offset,
        "prompt_billing_residual": pa.array(prompt_residual, pa.int64(), mask=~(prompt_known & has_convention)),
    }, mismatched, examples), summary


def with_settled(table: Any, settled: Settled, offset: int, total: Result) -> Any:
    """A slice of the first pass's table (rows offset.. of the whole) with the settled columns;
    the examples of the mismatches it holds go to `total`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    for name, column in settled.columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, column.slice(offset, n))
    mismatched = settled.mismatched[offset:offset + n]
    if mismatched.any():
        k = table.schema.get_field_index("quarantine_reason")
        table = table.set_column(k, "quarantine_reason", pc.if_else(
            pa.array(mismatched), pa.scalar("billing_mismatch", pa.string()), table.column(k)))
        ids = table.column("prompt_id")
        for i, detail in settled.examples:
            if offset <= i < offset + n:
                total.examples["billing_mismatch"].append(f"{ids[i - offset].as_py()}: {detail}")
    return table


def _ints(rows: list[dict], key: str, name: str) -> dict[str, Any]:
    import numpy as np

    values = [r[key] for r in rows]
    return {name: np.array([v or 0 for v in values], dtype=np.int64),
            f"{name}_known": np.array([v is not None for v in values], dtype=bool)}
