#!/usr/bin/env bash
# runyard's two commands:
#   ./dev.sh up [runyard up options]   set up .venv, start the scheduler + UI, print the URL to open (with its token)
#   ./dev.sh test [pytest options]     set up .venv with the test tools (and Chromium) and run the tests:
#                                      with options, plain `pytest OPTIONS`; without (as CI): ruff and
#                                      mypy (the product strict, the tests too) at zero findings, then
#                                      the tiers tests/unit, tests/faults +
#                                      tests/integration, tests/browser, each its own pytest run (on
#                                      4, 3 and 2 pytest-xdist workers) with
#                                      --durations=25 and a JUnit XML in $RUNYARD_TEST_REPORTS (default
#                                      .test-reports/), a failing tier stopping the later ones; the
#                                      both-database tests also run on PostgreSQL when
#                                      RUNYARD_TEST_POSTGRES_URL is set (.ci/run starts one); the
#                                      frameworks' tests in an environment with transformers and
#                                      Lightning it installs in .venv-frameworks/
#   ./dev.sh setup | test-setup        only set up .venv: for `up`, or with the test tools (.ci/run
#                                      runs it beside its apt-get, then `./dev.sh test`)
#
# A torch that already satisfies the range (for example a GPU workstation's CUDA build in the
# system Python) is kept: the venv then sees the system packages. Otherwise torch is installed:
# the CUDA build from PyPI where nvidia-smi finds a GPU, else torch==$RUNYARD_TORCH_VERSION
# (default 2.13.0), from $RUNYARD_TORCH_INDEX when set (e.g. PyTorch's CPU wheel index).
set -euo pipefail
cd "$(dirname "$0")"

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  up|test|setup|test-setup) ;;
  *) echo "usage: ./dev.sh up|test|setup|test-setup [args...]" >&2; exit 2 ;;
esac

PY="${PYTHON:-python3}"
VENV="${RUNYARD_VENV:-.venv}"
TORCH_OK='import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if (2, 4) <= v < (3, 0) else 1)'

log() { echo "[dev.sh $(date +%T)] $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "$TORCH_OK" 2>/dev/null; then
    log "keeping the torch of $PY ($("$PY" -c 'import torch; print(torch.__version__)')); venv sees system packages"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"

if ! "$VPY" -c "$TORCH_OK" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    log "installing torch (CUDA build) from PyPI"
    "$VPY" -m pip install -q "torch>=2.4,<3"
  else
    ver="${RUNYARD_TORCH_VERSION:-2.13.0}"
    log "installing torch==$ver (CPU)"
    if [ -n "${RUNYARD_TORCH_INDEX:-}" ]; then
      "$VPY" -m pip install -q "torch==$ver" --index-url "$RUNYARD_TORCH_INDEX" --extra-index-url https://pypi.org/simple
    else
      "$VPY" -m pip install -q "torch==$ver"
    fi
  fi
fi

extras="gpu,scripts,debug"
# PostgreSQL's driver where RUNYARD_DB_URL names PostgreSQL; the tests always get it (they run on
# a PostgreSQL too where one is given: tests/databases.py).
case "${RUNYARD_DB_URL:-}" in postgresql*|postgres:*) extras="$extras,postgres" ;; esac
case "$cmd" in test|test-setup) extras="gpu,scripts,debug,postgres,test" ;; esac
stamp="$VENV/.runyard-installed"
want="$(cat pyproject.toml | sha256sum | cut -c1-16)-$extras"
# runyard and its dependencies (about 96 packages) with uv where it can be had: it resolves,
# downloads and byte-compiles them in parallel, about 20 s against pip's 55 s on two cores
# (docs/benchmarks-journal.md, "The test suite"). uv reads PyPI (or its own UV_INDEX_URL), not
# pip's configuration, and does not see packages outside the venv: so the torch installed above
# is pinned for it, a venv that sees the system's packages is left to pip, and where uv cannot be
# installed or fails pip installs (RUNYARD_INSTALLER=pip asks for pip alone).
install_runyard() {
  if [ "${RUNYARD_INSTALLER:-uv}" = uv ] && ! grep -qs "include-system-site-packages = true" "$VENV/pyvenv.cfg" \
     && { [ -x "$VENV/bin/uv" ] || "$VPY" -m pip install -q uv >/dev/null 2>&1; }; then
    local pin rc=0
    pin="$(mktemp /tmp/runyard-torch-pin.XXXXXX)"
    "$VPY" -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > "$pin"
    "$VENV/bin/uv" pip install -q --python "$VPY" --compile-bytecode --constraint "$pin" -e ".[$extras]" || rc=$?
    rm -f "$pin"
    [ "$rc" -eq 0 ] && return 0
    log "uv could not install runyard[$extras] (exit $rc); pip installs it"
  fi
  "$VPY" -m pip install -q -e ".[$extras]"
}
if [ ! -f "$stamp" ] || ! grep -qx "$want" "$stamp" 2>/dev/null; then
  log "installing runyard[$extras] into $VENV"
  install_runyard
  echo "$want" > "$stamp"
fi

# runyard's own modules compiled once: every rank, agent, CLI call and scheduler imports them, and
# where PYTHONDONTWRITEBYTECODE is set (as on these machines) Python would compile them again in
# each process (0.05-0.1 s of CPU each, about a thousand processes in a test run). Python checks
# each file's timestamp, so an edited module is compiled afresh, never read stale.
"$VPY" -m compileall -q -j 0 app orchestrator trainer db runyard.py >/dev/null

case "$cmd" in
  setup|test-setup) log "ready: $VENV/bin/runyard" ;;
  up)
    exec "$VENV/bin/runyard" up "$@"
    ;;
  test)
    if ! command -v chromium-headless-shell >/dev/null 2>&1 && ! command -v chromium >/dev/null 2>&1; then
      log "installing Chromium's headless shell for the browser tests"
      SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
      if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium-headless-shell >/dev/null; }; then
        log "could not install chromium-headless-shell; browser tests will be skipped"
      fi
    fi
    # The whole suite (no arguments, as CI runs it) starts with the checks that keep the house in
    # order: ruff and mypy at zero findings (configured in pyproject.toml).
    if [ $# -eq 0 ]; then
      log "ruff check"
      "$VPY" -m ruff check
      # Then the tiers, cheapest first, each its own pytest run with its 25 slowest tests and a
      # JUnit XML file under $RUNYARD_TEST_REPORTS (default .test-reports/); a tier that fails
      # (exit code 5, nothing collected, counts as a failure) stops the later ones. pytest's own
      # closing line of the last tier stays the last line of output.
      reports="${RUNYARD_TEST_REPORTS:-.test-reports}"
      mkdir -p "$reports"
      # mypy (about 30 s of one core from a clean clone, the tests' modules a sixth of it; pyproject's
      # `files` names the product and tests/) runs beside the unit tier, whose tests
      # leave part of the two cores idle while they wait on their subprocesses; its result is
      # read before any slower tier starts, and a finding stops them as a failed tier does.
      # The Hugging Face and Lightning environment of tests/integration/test_frameworks.py (about
      # 45 s of pip, sharing .venv's torch: tests/services/frameworks.sh), installed beside the
      # unit tier and kept in .venv-frameworks/ for the next run; its tests wait for it.
      if [ -z "${RUNYARD_TEST_FRAMEWORKS:-}" ]; then
        log "the frameworks' environment for tests/integration/test_frameworks.py, beside the unit tier (.venv-frameworks/)"
        eval "$(tests/services/frameworks.sh start .venv-frameworks)"
        export RUNYARD_TEST_FRAMEWORKS
      fi
      log "mypy, beside the unit tier (its output: $reports/mypy.txt)"
      "$VPY" -m mypy > "$reports/mypy.txt" 2>&1 & mypy_pid=$!
      mypy_result() {
        local rc=0
        wait "$mypy_pid" || rc=$?
        log "mypy: $(tail -n 1 "$reports/mypy.txt")"
        [ "$rc" -eq 0 ] || { cat "$reports/mypy.txt" >&2; exit "$rc"; }
        mypy_pid=""
      }
      # Each tier on its own number of pytest-xdist workers (docs/benchmarks-journal.md, "The
      # test suite", has the measurements): two unit workers kept 1.6 of the two cores busy (their
      # tests wait on subprocesses, timeouts and PostgreSQL), four fill them (233 s against 264 s);
      # the slow tiers' tests mostly wait on the runs they start (about 0.8 of a core each), so
      # three of them share two cores; the browser tests (Chromium, Streamlit and a run each) kept
      # 1.4 of them busy two at a time, but at three (CI 45-46) each took 1.2-2x as long and two of
      # them missed what they watch for (docs/benchmarks-journal.md, "Flaky tests found").
      # tests/conftest.py keeps the Slurm tests on one worker.
      # RUNYARD_TEST_WORKERS overrides all three.
      for tier in "unit 4" "faults integration 3" "browser 2"; do
        workers="${RUNYARD_TEST_WORKERS:-${tier##* }}"; tier="${tier% *}"
        name="${tier// /+}"
        paths=(); for t in $tier; do paths+=("tests/$t"); done
        xdist=(); [ "$workers" -gt 1 ] && xdist=(-n "$workers" --dist loadgroup)
        # Nothing is printed after pytest, so its closing line stays the last line CI reads.
        echo "===== $(date +%T) tier: $name (${paths[*]}, $workers worker(s); JUnit XML: $reports/$name.xml; a failure stops the later tiers) ====="
        rc=0
        "$VPY" -m pytest "${paths[@]}" "${xdist[@]}" --durations=25 --junitxml="$reports/$name.xml" || rc=$?
        [ "$rc" -eq 0 ] || { [ -z "$mypy_pid" ] || kill "$mypy_pid" 2>/dev/null; exit "$rc"; }
        [ -z "$mypy_pid" ] || mypy_result
      done
      exit 0
    fi
    exec "$VPY" -m pytest "$@"
    ;;
esac
