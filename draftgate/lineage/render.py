"""The audit's rows as text: an aligned table, Markdown or CSV (csv keeps every hash whole)."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime
from typing import Any

HASH = re.compile(r"^[0-9a-f]{32,64}(\.dir)?$")
COMPACT = ["run", "kind", "committed_at", "gates_passed", "gates_failed", "mismatch_rate", "billing_agreement",
           "acceptance_length", "spent_usd", "tokenizer_fingerprint", "template_fingerprint", "weights_fingerprint"]


def cell(v: Any, full: bool) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "pass" if v else "FAIL"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M")
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    text = str(v)
    if not full and HASH.match(text):
        return text[:8] + (".dir" if text.endswith(".dir") else "")
    return text


def render(rows: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    cols = columns or list(rows[0])
    full = fmt == "csv"
    cells = [[cell(r.get(c), full) for c in cols] for r in rows]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(cells)
        return buf.getvalue()
    if fmt == "md":
        esc = [[c.replace("|", "\\|") for c in row] for row in cells]
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in esc]) + "\n"
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    widths = [min(w, 60) for w in widths]
    line = lambda vals: "  ".join(v[:w].ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(row) for row in cells]) + "\n"
