#!/usr/bin/env bash
# Installs the two peer predictors, each in its own virtualenv, never in the project's .venv:
#   benchmarks/.peers/llm-analysis/  venv with llm-analysis==0.2.2 (PyPI)
#   benchmarks/.peers/ett/           venv with estimate-train-time @ 1ac4d5e44116 (from ../shared/vendor), source in src/
#   benchmarks/.peers/ett-data/      a copy of the corpus's Perlmutter (A100) operator samples; the tool writes
#                                    its fitted regressors (pickles/json) next to them, so it must not be the corpus
# Idempotent: a step whose stamp (versions, tarball and sample checksums) still matches is skipped.
# Environment: PYTHON (default python3), TRACEKIT_PEERS_DIR (default benchmarks/.peers),
#              TRACEKIT_SHARED (default ../shared beside the checkout).
# Exit status 0 when both peers are ready; otherwise 1 with a one-line reason on stderr.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PEERS=${TRACEKIT_PEERS_DIR:-$ROOT/benchmarks/.peers}
SHARED=${TRACEKIT_SHARED:-$ROOT/../shared}
PY=${PYTHON:-python3}
ETT_TARBALL=$SHARED/vendor/estimate-train-time-1ac4d5e44116.tar.gz
ETT_SAMPLES=$SHARED/corpus/operator-samples/estimate-train-time/Perlmutter

say() { echo "setup.sh: $*"; }
die() { echo "setup.sh: FAILED: $*" >&2; exit 1; }
first_error() {  # the most telling line of a pip log, for a one-line reason
  local line
  line=$(grep -m1 -E '^ERROR|Error:|error:' "$1" 2>/dev/null || true)
  [ -n "$line" ] || line=$(tail -n 1 "$1" 2>/dev/null || true)
  printf '%s' "$line" | tr -d '\r' | cut -c1-300
}

command -v "$PY" >/dev/null 2>&1 || die "no '$PY' on PATH (set PYTHON=/path/to/python3.8+)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"
PYVER=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])') || die "'$PY' does not run"
mkdir -p "$PEERS" || die "cannot create $PEERS"

# fresh_venv LABEL DIR STAMP: 1 (nothing to do) when DIR holds a virtualenv set up for STAMP, else 0 after making
# DIR a new empty virtualenv
fresh_venv() {
  if [ -x "$2/bin/python" ] && [ "$(cat "$2/.ready" 2>/dev/null)" = "$3" ]; then
    say "$1: already set up in $2 ($3)"
    return 1
  fi
  say "$1: creating venv $2 with $PY ($PYVER)"
  rm -rf "$2"
  "$PY" -m venv "$2" || die "'$PY -m venv $2' failed (python3-venv missing?)"
}

# ---------------------------------------------------------------------------------------------- llm-analysis
LA=$PEERS/llm-analysis
LA_STAMP="llm-analysis==0.2.2 python=$PYVER constraints=$(sha256sum "$HERE/llm-analysis-constraints.txt" | cut -c1-16)"
if fresh_venv llm-analysis "$LA" "$LA_STAMP"; then
  log=$PEERS/llm-analysis-setup.log
  say "llm-analysis: pip install llm-analysis==0.2.2 (pinned by benchmarks/peers/llm-analysis-constraints.txt; log $log)"
  if ! "$LA/bin/python" -m pip install --disable-pip-version-check -c "$HERE/llm-analysis-constraints.txt" \
      "llm-analysis==0.2.2" >"$log" 2>&1; then
    die "pip install llm-analysis==0.2.2 failed: $(first_error "$log") (log: $log)"
  fi
  got=$("$LA/bin/python" -c 'import importlib.metadata as m, llm_analysis.analysis; print(m.version("llm-analysis"))' 2>>"$log") \
    || die "llm-analysis installed but does not import: $(first_error "$log") (log: $log)"
  [ "$got" = "0.2.2" ] || die "llm-analysis $got installed, expected 0.2.2"
  echo "$LA_STAMP" >"$LA/.ready"
  say "llm-analysis: ready (llm-analysis $got)"
fi

# ------------------------------------------------------------------------------------------ estimate-train-time
[ -f "$ETT_TARBALL" ] || die "estimate-train-time tarball not found at $ETT_TARBALL (set TRACEKIT_SHARED)"
[ -d "$ETT_SAMPLES" ] || die "Perlmutter operator samples not found at $ETT_SAMPLES (set TRACEKIT_SHARED)"
ETT=$PEERS/ett
ETT_STAMP="estimate-train-time@1ac4d5e44116 tarball=$(sha256sum "$ETT_TARBALL" | cut -c1-16) python=$PYVER constraints=$(sha256sum "$HERE/ett-constraints.txt" | cut -c1-16)"
ett_rebuilt=0
if fresh_venv estimate-train-time "$ETT" "$ETT_STAMP"; then
  mkdir -p "$ETT/src" && tar -xzf "$ETT_TARBALL" -C "$ETT/src" || die "cannot unpack $ETT_TARBALL"
  [ -f "$ETT/src/estimate-train-time/pyproject.toml" ] || die "unexpected tarball layout: no estimate-train-time/pyproject.toml"
  log=$PEERS/ett-setup.log
  say "estimate-train-time: pip install ./estimate-train-time (deps pinned by benchmarks/peers/ett-constraints.txt; log $log)"
  if ! (cd "$ETT/src" && "$ETT/bin/python" -m pip install --disable-pip-version-check \
      -c "$HERE/ett-constraints.txt" ./estimate-train-time) >"$log" 2>&1; then
    die "pip install ./estimate-train-time failed: $(first_error "$log") (log: $log)"
  fi
  "$ETT/bin/python" -c 'import estimate_train_time.estimator.prediction' 2>>"$log" \
    || die "estimate-train-time installed but does not import: $(first_error "$log") (log: $log)"
  echo "$ETT_STAMP" >"$ETT/.ready"
  ett_rebuilt=1
  say "estimate-train-time: ready ($("$ETT/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
    | awk '$1 ~ /^(estimate-train-time|scikit-learn|xgboost|pandas|numpy)$/ {printf "%s %s, ", $1, $2}' | sed 's/, $//'))"
fi

# ------------------------------------------------------------------------------------------------- ett-data
DATA=$PEERS/ett-data
DATA_STAMP="samples=$( (cd "$ETT_SAMPLES" && find . -type f -name '*.csv' | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-16)"
if [ "$ett_rebuilt" = 0 ] && [ -d "$DATA/Perlmutter" ] && [ "$(cat "$DATA/.ready" 2>/dev/null)" = "$DATA_STAMP" ]; then
  nfit=$(find "$DATA/Perlmutter" -type f \( -name '*.pkl' -o -name '*.json' \) | wc -l)
  say "ett-data: already in $DATA ($nfit fitted regressors cached beside the samples)"
else
  # a rebuilt venv (other scikit-learn/xgboost) must not reuse regressors pickled by the old one
  rm -rf "$DATA"
  mkdir -p "$DATA" && cp -R "$ETT_SAMPLES" "$DATA/Perlmutter" || die "cannot copy $ETT_SAMPLES to $DATA"
  echo "$DATA_STAMP" >"$DATA/.ready"
  say "ett-data: copied $(find "$DATA/Perlmutter" -type f -name '*.csv' | wc -l) sample CSVs to $DATA/Perlmutter" \
    "(the first estimate-train-time prediction fits its regressors there)"
fi

say "done: both peers ready under $PEERS"
