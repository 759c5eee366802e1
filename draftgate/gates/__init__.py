"""Gates: a plain-JSON suite run by Great Expectations on one artifact, before the next stage.

    suite.py     the suite file -> Suite; $PARAMETER from params.yaml; the columns it reads
    table.py     named inputs -> only those columns -> the pandas frame GX validates
    custom.py    the custom expectations (registered with GX when imported)
    gx.py        GX itself, through its public API: context, validation, Data Docs, pruning old runs
    docs.py      the Data Docs offline: pages load the vendored assets/ instead of CDNs
    merge.py     results of batches merged into the whole table's
    compute.py   Computed, and running the check a computing suite names (handed over by its stage)
    result.py    the metric (numbers) and result (everything) files; require_passed() for the next stage
    validate.py  run_gate() and the gate's command line (`draftgate validate`, stages/gate*.py)

The generic engine only: it imports draftgate.config and draftgate.io, nothing of the domain.
Checks that need the domain (a forward pass, an export's naming rules) live in draftgate/checks/
and reach the engine as functions, passed by their gate stage.

Nothing is imported here: a stage that only reads a gate's verdict imports draftgate.gates.result
and depends on that file alone.
"""
