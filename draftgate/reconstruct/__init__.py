"""Reconstruct the exact token ids of API responses; classify, flag and reconcile them.

normalise (provider quirks) -> core (render, one batched encode, choose ids, classify, flags)
-> table (Arrow in/out, billing over the whole table, mismatch report). prefix, logprobs,
classify, flags, billing hold one concern each; contract checks the stage's trusted inputs.
"""

from draftgate.reconstruct.core import ReconstructError, Result, Setup, reconstruct
from draftgate.reconstruct.table import mismatch_report, reconstruct_table

__all__ = ["ReconstructError", "Result", "Setup", "mismatch_report", "reconstruct", "reconstruct_table"]
