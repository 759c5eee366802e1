"""EAGLE-3 drafter: draft vocabulary, model, training, export (docs/drafter.md)."""
