# attnlab: `make demo` trains a small GPT and prints a sample; `make test` runs the test suite;
# `make serve` installs what `attnlab serve` needs; `make docs` builds the documentation site
# (--strict). They create .venv on first use. torch is installed first, pinned, so that pip takes
# the local CPU wheel instead of resolving a CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  := torch==2.13.0

.PHONY: demo test install dev serve docs browser lint bench clean gpu-check

demo: $(VENV)/.installed
	$(BIN)/attnlab demo

test: $(VENV)/.dev-installed browser
	$(BIN)/pytest

serve: $(VENV)/.serve-installed
	@echo "ready: $(BIN)/attnlab serve RUN [RUN ...]"

# The first run on a GPU machine (docs/development.md): the CUDA tests (tests/gpu) and each family's
# preset for 50 steps, a table, and runs/gpu-check.json. GPU_CHECK_ARGS adds options, e.g. --data-dir DIR.
gpu-check: $(VENV)/.dev-installed
	$(BIN)/python scripts/gpu_check.py $(GPU_CHECK_ARGS)

# The site from docs/ and mkdocs.yml into site/. --strict: a broken link or anchor, a page missing
# from the nav, or a docstring mkdocstrings cannot read is an error. CI runs it (.ci/run).
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	@echo "docs: site/index.html"

# The page's browser test drives Debian's chromium through chromium-driver. Installed here when
# missing and apt-get is usable (root); otherwise one line, and the test skips saying why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get -qq update >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends chromium chromium-driver >/dev/null || \
	  echo "make: chromium and chromium-driver are not installed (needs root and apt-get): the browser test will skip"; }

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# attnlab's C++ kernels are compiled for this CPU here, once (a few minutes), so that no command
# pauses for them later; where they cannot be built, attnlab says so and runs on PyTorch's operators.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e .
	$(BIN)/attnlab kernels build || true
	touch $@

$(VENV)/.serve-installed: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[serve]"
	touch $@

$(VENV)/.docs-installed: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[docs]"
	touch $@

$(VENV)/.dev-installed: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[dev,plot]"
	touch $@

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache src/*.egg-info
