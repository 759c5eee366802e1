"""Evaluation of drafters by real speculative decoding with the target (docs/evaluation.md).

loop.py (the target's KV-cached verify loop and plain greedy decoding), proposers.py (eagle3,
ngram, oracle, random), ngram.py (vLLM's prompt-lookup rule), stats.py (acceptance length,
per-position rates, bootstrap interval), run.py (held-out prompts -> outputs table and metrics),
measure.py (the eval stage's work: every proposer over the held-out prompts).
"""
