"""Gate checks that need the domain: each recomputes, from the raw artifacts, what its suite judges.

    hidden.py    the hidden-state shards against the tokens table and the target (a forward pass)
    drafter.py   the exports by each engine's naming rules; the vocabulary map rebuilt from tokens
    eval.py      plain greedy decoding with the target, held against every speculative output
    template.py  each template probe's stored conversation read again into shape features, counted per mode
    repair.py    the repaired rows made exact (ids against the backend's own) against what their confidences predict

Each module's `compute(inputs, params_path) -> Computed` is handed to the generic engine
(draftgate/gates) by its gate stage (stages/gate_<name>.py): the engine imports nothing from here,
and only stages import these modules. A check is a second opinion: it shares no parser with the
producer it checks (reading the format again is the point), only the domain code it must run
(the target, the export's naming rules).
"""
