"""Repair (issue 18): ids rebuilt from text, re-segmented to the tokenization the target most
likely sampled, held to the billed length. docs/repair.md has the method and its assumptions.

score.py: per-token log-probabilities under the target at the sampling settings (backends:
the HF target in process, vLLM's /v1/completions, SGLang's /generate). search.py: the bounded
lattice over re-segmentations of one row's text spans. run.py: the tokens table in, the
repaired table and metrics out (what stages/repair.py will call).
"""
