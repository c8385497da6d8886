# attnlab: `make demo` trains a small GPT and prints a sample; `make test` runs the test suite;
# `make serve` installs what `attnlab serve` needs; `make docs` builds the documentation site
# (--strict). They create .venv on first use. torch is installed first, pinned, so that pip takes
# the local CPU wheel instead of resolving a CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  := torch==2.13.0

.PHONY: demo test test-fast test-avx2 install dev serve docs browser lint bench clean gpu-check gguf-converter

demo: $(VENV)/.installed
	$(BIN)/attnlab demo

# The suite runs in one process per core (pytest-xdist; `make test WORKERS=1` runs it in one), each
# with one PyTorch thread: two processes with a pool of threads each stall each other, while most
# tests are single-threaded Python anyway. The slowest tests are listed at the end.
WORKERS ?= auto
PYTEST  := OMP_NUM_THREADS=1 $(BIN)/pytest -n $(WORKERS)

test: $(VENV)/.dev-installed browser gguf-converter
	$(PYTEST) --durations=25

# The edit loop: the suite less the modules marked slow (they train, start processes or servers,
# drive the browser or run the docs' examples). `make test` runs everything.
test-fast: $(VENV)/.dev-installed
	$(PYTEST) -m "not slow"

# The AVX2 code paths on any x86-64 CPU, AVX-512 ones included (CI runs this after `make test`):
# the C++ kernels built for x86-64-v3 (AVX2, no AVX-512) and PyTorch's and oneDNN's kernels capped
# at AVX2, then the numerical suites. Its own inductor cache: compiled code cached under one cap
# computed wrong results when loaded under the other.
AVX2 := ATTNLAB_MARCH=x86-64-v3 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \
        TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/$(VENV)/inductor-avx2
# The numerical suites: tests/accel, every test of the tuned code (kernels, fused decoding and its
# batching, training kernels, ClippingAdamW, projections, the float bound), less the builds' own
# tests (`not build`), which compile extensions rather than compare numbers.
NUMERICAL := tests/accel -m "not build"

test-avx2: $(VENV)/.dev-installed
	@case "$$(uname -m)" in x86_64|amd64) ;; *) echo "make: test-avx2 is for x86-64 CPUs; skipped"; exit 0;; esac; \
	grep -qw avx2 /proc/cpuinfo || { echo "make: this CPU has no AVX2; test-avx2 skipped"; exit 0; }; \
	$(AVX2) $(BIN)/attnlab kernels build && $(AVX2) $(PYTEST) $(NUMERICAL)

serve: $(VENV)/.serve-installed
	@echo "ready: $(BIN)/attnlab serve RUN [RUN ...]"

# The first run on a GPU machine (docs/development.md): the CUDA tests (tests/gpu) and each family's
# preset for 50 steps, a table, and runs/gpu-check.json. GPU_CHECK_ARGS adds options, e.g. --data-dir DIR.
gpu-check: $(VENV)/.dev-installed
	$(BIN)/python scripts/gpu_check.py $(GPU_CHECK_ARGS)

# The site from docs/ and mkdocs.yml into site/. --strict: a broken link or anchor, a page missing
# from the nav, or a docstring mkdocstrings cannot read is an error. CI runs it (.ci/run). No
# --quiet: it silences the warnings, and --strict counts only the warnings it sees (a broken link
# passed quietly here and failed every other build).
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
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
	@echo "installing PyTorch (CPU build) and attnlab into $(VENV) (a few minutes, once) ..."
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

# llama.cpp's own converter (convert_hf_to_gguf.py, its conversion/ package and its own gguf-py/) for
# tests/models/hf/test_gguf.py, unpacked from llama-cpp-python's source distribution (nothing is
# built, a few seconds after the 75 MB download); the tests skip, naming this target, without it.
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
GGUF_CONVERTER   := $(VENV)/llama-cpp-converter

gguf-converter: $(GGUF_CONVERTER)/convert_hf_to_gguf.py

$(GGUF_CONVERTER)/convert_hf_to_gguf.py: | $(BIN)/python
	rm -rf $(GGUF_CONVERTER).tmp $(GGUF_CONVERTER) && mkdir -p $(GGUF_CONVERTER).tmp
	$(BIN)/pip download --quiet --no-deps --no-binary :all: -d $(GGUF_CONVERTER).tmp $(LLAMA_CPP_PYTHON)
	tar -xzf $(GGUF_CONVERTER).tmp/llama_cpp_python-*.tar.gz -C $(GGUF_CONVERTER).tmp --strip-components=3 \
	  --wildcards '*/vendor/llama.cpp/convert_hf_to_gguf.py' '*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/gguf-py/*'
	rm $(GGUF_CONVERTER).tmp/llama_cpp_python-*.tar.gz
	mv $(GGUF_CONVERTER).tmp $(GGUF_CONVERTER)

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache src/*.egg-info
