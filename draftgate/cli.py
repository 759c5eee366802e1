"""`draftgate` console script: a thin dispatcher; each command lives in its own module.

Modules load only when their command runs, so `draftgate --help` stays fast (no torch, GX, pandas).
"""

from __future__ import annotations

import importlib
import sys

# command -> (module with main(argv), one-line help)
COMMANDS = {
    "validate": ("draftgate.gates.validate", "run a Great Expectations suite on an artifact; exit 1 when it fails"),
    "contract": ("draftgate.contract", "check the tokenizer contract for a template"),
    "estimate": ("draftgate.client.estimate", "project tokens, cost and wall time before any request"),
    "serve": ("draftgate.serve.local", "serve the local model behind an OpenAI-compatible API"),
    "lineage": ("draftgate.lineage.lineage", "the stages, data, params, fingerprints and gate verdicts behind an artifact"),
    "audit": ("draftgate.lineage.audit", "DuckDB tables over every commit and experiment; --diff A B says what changed"),
    "report": ("draftgate.lineage.report", "reports/index.html: Data Docs, plots as inline SVG, the latest audit"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: draftgate COMMAND [ARGS]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<10} {text}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"draftgate: unknown command {name!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
