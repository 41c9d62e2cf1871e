# Two entry points (see README): `make demo` runs tracekit on the bundled traces, `make test` runs the suite.
# Both create the virtualenv in .venv and install what they need on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tracekit-installed
DEMO_STORE := .tracekit-demo
DEMO_OUT := .tracekit-demo-out

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO_STORE) $(DEMO_OUT)
	$(BIN)/tracekit ingest traces/kineto --store $(DEMO_STORE)
	$(BIN)/tracekit predict traces/configs/llemma-7b-a100.yaml --hardware A100-SXM4-80GB --gpus-per-node 4 \
		--trace-out $(DEMO_OUT)/predicted

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) $(DEMO_STORE) $(DEMO_OUT) .pytest_cache
