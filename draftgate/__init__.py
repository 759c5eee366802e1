"""draftgate: exact, gated, lineage-tracked EAGLE-3 drafter training data."""

__version__ = "0.1.0"
