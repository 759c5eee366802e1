"""Reconstruct the exact token ids of API responses; classify, flag and reconcile them.

normalise (provider quirks) -> core (render, one batched encode, choose ids, classify, flags)
-> table (Arrow in/out, billing over the whole table, mismatch report). prefix, logprobs,
classify, flags, billing hold one concern each; inputs loads and re-checks the stage's trusted
inputs (the contract's special ids, the upstream gate). The providers' request rules, which the
prompts stage applies too, are draftgate/provider_rules.py, below both stages.

Nothing is imported here: a stage's DVC deps list the modules it reaches, not the whole package.
"""
