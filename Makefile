# Lesson 83 homework package. Two entry points for a new user: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo release selfcheck grade report test clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "Python 3.11 is needed (set PY=/path/to/python3.11)"; exit 1; }
	# Debian packages: bubblewrap sandboxes the grader (without it grading falls back to resource limits and
	# says so); chromium renders the TA report in the tests.
	command -v bwrap >/dev/null && command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq bubblewrap chromium >/dev/null; } || echo "could not install bubblewrap and chromium (not root?): see README"
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first, so that nothing later pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
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

test: setup
	$(BIN)/ruff check .
	$(BIN)/pytest -q

clean:
	rm -rf dist build .pytest_cache
