# Entry points (see README): `make demo` runs tracekit on the bundled traces, `make test` runs the suite, `make lint`
# runs ruff and mypy (configured in pyproject.toml), `make docs` builds the documentation site into site/ (mkdocs
# --strict). Each creates the virtualenv in .venv and installs what it needs on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tracekit-installed
DOCS_STAMP := $(VENV)/.tracekit-docs-installed
DEMO_STORE := .tracekit-demo
DEMO_OUT := .tracekit-demo-out
TORCH := $(shell sed -n 's/.*"torch==\([0-9.]*\)".*/\1/p' pyproject.toml)

.PHONY: demo test lint docs install clean chromium profiles

install: $(STAMP)

# The first install takes minutes (torch, ray): it says what it installs, and pip names each package as it goes.
$(STAMP): pyproject.toml
	@echo "make: installing into $(VENV): tracekit and what it needs (numpy, pandas, pyarrow, scikit-learn, xgboost, typer, rich, ...) with the test extra (pytest, torch $(TORCH), ray, HTA, ruff, mypy, mkdocs, ...); a few minutes the first time"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[test]'
	touch $(STAMP)

$(DOCS_STAMP): pyproject.toml
	@echo "make: installing into $(VENV): tracekit with the docs extra (mkdocs, mkdocs-material, mkdocstrings)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[docs]'
	touch $(DOCS_STAMP)

demo: $(STAMP)
	rm -rf $(DEMO_STORE) $(DEMO_OUT)
	$(BIN)/tracekit ingest traces/kineto --store $(DEMO_STORE)
	$(BIN)/tracekit predict traces/configs/llemma-7b-a100.yaml --hardware A100-SXM4-80GB --gpus-per-node 4 \
		--trace-out $(DEMO_OUT)/predicted

test: $(STAMP) chromium
	$(BIN)/python -m pytest

# Every shipped fitted number refitted from the corpus (tools/fit_profiles.py: stack profiles, kernel paths, the transfer
# selection), then tracekit/data/fitted.json, which the suite checks the tree against: run it after a change to the
# predictor, the models or tracekit/data, and commit what it rewrites. About 4 minutes of CPU.
profiles: $(STAMP)
	$(BIN)/python tools/fit_profiles.py

# Lint, type check and layers: ruff over the whole tree, mypy over the packages, import-linter's contract for the
# layers of DESIGN.md ([tool.ruff], [tool.mypy] and [tool.importlinter] in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site: every page, link and anchor checked (--strict), the API page read from the docstrings.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The HTML report tests render pages in headless Chromium: installed from the distribution's packages when missing
# and this user may (root, or passwordless sudo); otherwise one line says how.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ] && command -v apt-get >/dev/null 2>&1 && \
	     $$SUDO apt-get update -qq >/dev/null 2>&1 && $$SUDO apt-get install -y -qq chromium >/dev/null 2>&1; then \
	    echo "make: installed chromium (headless HTML tests)"; \
	  else echo "make: chromium is missing and could not be installed here: the 4 HTML report tests will fail (install the distribution's chromium package)"; fi; }

clean:
	rm -rf $(VENV) $(DEMO_STORE) $(DEMO_OUT) .pytest_cache site
