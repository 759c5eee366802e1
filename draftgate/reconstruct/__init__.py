"""Reconstruct the exact token ids of API responses; classify, flag and reconcile them.

normalise (provider quirks) -> core (render, one batched encode, choose ids, classify, flags)
-> table (Arrow in/out, billing over the whole table, mismatch report). prefix, logprobs,
classify, flags, billing hold one concern each; inputs loads and re-checks the stage's trusted
inputs (the contract's special ids, the upstream gate); request holds the providers' request rules.

Nothing is imported here: the prompts stage uses draftgate.reconstruct.request alone, and its DVC
deps list that file, not the whole package.
"""
