"""Lineage and audits over the pipeline's own records: dvc.yaml, dvc.lock, the metrics and gate files.

Nothing here re-runs a stage or trusts a file's name: a revision's state is read from git (commits
and DVC experiments, which DVC stores as commits under refs/exps/) or from the workspace, and an
artifact DVC cached but git does not hold is read from the DVC cache by the md5 dvc.lock records.

- snapshot.py: one revision's files (workspace, commit, experiment), resolved by name
- pipeline.py: dvc.yaml + dvc.lock as stages, artifacts and the walk from an artifact upstream
- facts.py:    what the stage files say (gate verdicts, fingerprints, generation spend, figures)
- lineage.py:  `draftgate lineage PATH`
- audit.py:    `draftgate audit` (DuckDB tables over every revision; `--diff A B`)
- report.py:   `draftgate report` (reports/index.html, offline, plots as inline SVG)

docs/lineage.md explains the tables and the queries users need.
"""
