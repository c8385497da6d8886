# attnlab: `make demo` trains a small GPT and prints a sample; `make test` runs the test suite.
# Both create .venv on first use. torch is installed first, pinned, so that pip takes the local
# CPU wheel instead of resolving a CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  := torch==2.13.0

.PHONY: demo test install dev lint bench clean

demo: $(VENV)/.installed
	$(BIN)/attnlab demo

test: $(VENV)/.dev-installed
	$(BIN)/pytest

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.dev-installed: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[dev,plot]"
	touch $@

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache src/*.egg-info
