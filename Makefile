# Lesson 83 homework package. Two entry points for a new user: `make demo` and `make test` (`make check`: the
# quick tier of the tests, for contributors).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# PyTorch's CPU build: the version and the CPU index that the Gradescope zip's setup.sh installs (read from
# autograder/release/common.py). With --extra-index-url the index's "+cpu" wheel sorts above PyPI's CUDA build of the same
# release; a short timeout keeps set-up going where that index cannot be reached (pip's own index and
# find-links serve then). Set LESSON83_TORCH_INDEX_URL empty to take torch from pip's own index only.
TORCH_VERSION := $(shell sed -n 's/^TORCH_VERSION = "\([^"]*\)".*/\1/p' autograder/release/common.py)
LESSON83_TORCH_INDEX_URL ?= $(shell sed -n 's/^TORCH_INDEX_URL = "\([^"]*\)".*/\1/p' autograder/release/common.py)
TORCH_PIP_ARGS := --timeout 10 --retries 0 torch==$(TORCH_VERSION) \
	$(if $(LESSON83_TORCH_INDEX_URL),--extra-index-url $(LESSON83_TORCH_INDEX_URL))

.PHONY: setup demo release selfcheck grade report check test clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "Python 3.11 is needed (set PY=/path/to/python3.11)"; exit 1; }
	# Debian packages: bubblewrap sandboxes the grader (without it grading falls back to resource limits and
	# says so); chromium renders the TA report in the tests.
	command -v bwrap >/dev/null && command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq bubblewrap chromium >/dev/null; } || echo "could not install bubblewrap and chromium (not root?): see README"
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first, so that nothing later pulls a CUDA build.
	$(BIN)/pip install -q $(TORCH_PIP_ARGS)
	test -z "$(LESSON83_TORCH_INDEX_URL)" || $(BIN)/python -W ignore -c 'import sys, torch; torch.version.cuda and sys.exit( \
		f"pip installed torch {torch.__version__}, a CUDA build: was $(LESSON83_TORCH_INDEX_URL) out of reach? " \
		"Run make setup again, or set LESSON83_TORCH_INDEX_URL= (empty) to keep this build.")'
	$(BIN)/pip install -q -e '.[dev,cluster]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

release: setup
	$(BIN)/lesson83 release

selfcheck: setup
	$(BIN)/lesson83 selfcheck

grade: setup
	$(BIN)/lesson83 grade dist/samples --out dist/grades

report: setup
	$(BIN)/lesson83 report dist/grades --out dist/report

demo: release selfcheck grade report

# The quick tier, for contributors: ruff, the import contract (pyproject.toml [tool.importlinter]: the engine's layers,
# no circles) and every test of tests/engine and tests/lesson83 that needs no sandbox,
# release build, browser, training or deploy environment (the markers in pyproject.toml), on two processes; it
# prints its time (under 2 minutes on two cores; tests/README.md says what goes where).
QUICK := not (sandbox or build or browser or training or deploy)
check: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo
	@start=$$(date +%s); $(BIN)/pytest -q -n 2 -m "$(QUICK)" --durations=10; rc=$$?; \
	echo "make check: $$(( $$(date +%s) - start )) s (load average $$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null))"; exit $$rc

# The full suite, as CI runs it (.ci/run), with the 25 slowest tests.
test: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo
	$(BIN)/pytest -q --durations=25

# dist/ but an nbgrader course that holds work (submissions, autograded or feedback folders, gradebook rows) and
# its grades folder beside it, which it keeps and names (autograder/release/keep.py: standard library only).
clean:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) autograder/release/keep.py dist
	rm -rf build .pytest_cache
