"""Hidden states in other tools' formats, in and out (docs/interop.md).

export.py (draftgate.hidden/1 shards -> SpecForge and speculators training data, with the draft
vocabulary of drafter/vocab.py), importer.py (speculators-format files from vLLM's extraction
path) and import_specforge.py (SGLang's). They read hidden's shards and the drafter's vocabulary,
so they sit above both: only the side stages export_data and import_hidden import them.
"""
