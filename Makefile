# SmartSched: the two commands of the README's quick start, and CI helpers.
# Every target installs what it needs into .venv, so a fresh machine works.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DEMO_OUT ?= reports/demo

.PHONY: demo test test-fast lint install install-test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e .
	touch $@

$(TEST_STAMP): pyproject.toml $(STAMP)
	$(PIP) install --quiet -e '.[test]'
	touch $@

install: $(STAMP)
install-test: $(TEST_STAMP)

demo: $(STAMP)
	$(VENV)/bin/smartsched demo --out $(DEMO_OUT)

test: $(TEST_STAMP)
	$(VENV)/bin/ruff check platform tests
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

test-fast: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check platform tests

bench: $(STAMP)
	$(VENV)/bin/smartsched bench speed

clean:
	rm -rf $(VENV) reports build *.egg-info platform/*.egg-info
