"""Hidden states of the target for EAGLE-3 drafters (docs/hidden-states.md).

The target itself (weights, fingerprint) is draftgate/target.py, below every stage that loads it.
capture.py (three auxiliary decoder-layer outputs and the final state before the norm, by hooks),
shards.py + extract.py (plan, atomic shards, resume by record and sha256, manifest last),
reader.py (one FeatureSource for offline shards and online capture), dist.py (torchrun ranks).
Hidden states in other tools' formats, in and out, are draftgate/exchange/.
"""
