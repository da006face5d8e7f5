# SmartSched: the two commands of the README's quick start, and CI helpers.
# Every target installs what it needs into .venv, so a fresh machine works.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DEMO_OUT ?= reports/demo

.PHONY: demo test test-fast lint install install-test bench clean prometheus

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
	$(VENV)/bin/smartsched demo --out $(DEMO_OUT) --overwrite

# The telemetry tests run a real Prometheus server (Debian's package). Installed
# here when missing and we are root; otherwise those tests skip and say how.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus package for the telemetry tests"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null \
	      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	           apt-get install -y -q --no-install-recommends prometheus >/dev/null; } \
	      || echo "could not install prometheus: its tests will skip (or fail under CI)"; \
	  else echo "prometheus not found: run 'apt-get install prometheus' (as root) for its tests"; fi; }

test: $(TEST_STAMP) prometheus
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
