# Two entry points (see README): `make demo` runs tracekit on the bundled traces, `make test` runs the suite.
# Both create the virtualenv in .venv and install what they need on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tracekit-installed
DEMO_STORE := .tracekit-demo

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO_STORE)
	$(BIN)/tracekit ingest traces/ --store $(DEMO_STORE)

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) $(DEMO_STORE) .pytest_cache
