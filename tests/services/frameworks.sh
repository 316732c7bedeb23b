#!/usr/bin/env bash
# A virtual environment with Hugging Face transformers (and accelerate, which its Trainer needs)
# and Lightning, for tests/integration/test_frameworks.py: the recipes of docs/frameworks.md run
# through `workload.python`, as a user with their own environment would.
#
# It shares runyard's torch: one line in a .pth file puts .venv's site-packages on its path after
# its own, so pip finds torch 2.13 installed and downloads the frameworks' pure-Python parts
# (about 45 s, 230 MB) instead of a CUDA torch (12.7 min, 5.7 GB: BENCHMARKS.md, "Framework
# installs"). The versions are pinned: a new release must not change what CI proves unannounced.
#
#   tests/services/frameworks.sh start DIR   prints RUNYARD_TEST_FRAMEWORKS=DIR for eval and installs
#                                            in the background: DIR/ready when done, else DIR/failed
#                                            (with DIR/install.log)
#   tests/services/frameworks.sh install DIR the same in the foreground
# An environment already in DIR with the same pins is kept (./dev.sh test keeps one in
# .venv-frameworks/ between runs).
set -euo pipefail
cd "$(dirname "$0")/../.."

PACKAGES=(transformers==5.24.0 accelerate==1.15.0 lightning==2.6.6)

install() {
  local dir="$1"
  if [ -f "$dir/ready" ] && [ "$(cat "$dir/pins" 2>/dev/null)" = "${PACKAGES[*]}" ] \
      && "$dir/venv/bin/python" -c 'import transformers, lightning' >/dev/null 2>&1; then
    return 0
  fi
  rm -rf "$dir/pins" "$dir/venv" "$dir/ready" "$dir/failed"
  mkdir -p "$dir"
  {
    local site
    site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # the interpreter .venv was made from: the shared packages are built for its version
    "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$dir/venv"
    local own
    own="$("$dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$site" > "$own/_runyard_shared.pth"
    "$dir/venv/bin/python" -m pip install -q --disable-pip-version-check "${PACKAGES[@]}"
    "$dir/venv/bin/python" -c 'import torch, transformers, accelerate, lightning; print("torch", torch.__version__, "transformers", transformers.__version__, "lightning", lightning.__version__)'
  } > "$dir/install.log" 2>&1 && { echo "${PACKAGES[*]}" > "$dir/pins"; touch "$dir/ready"; } \
    || { touch "$dir/failed"; return 1; }
}

case "${1:-}" in
  start)
    dir="$(realpath -m "$2")"
    mkdir -p "$dir"
    echo "RUNYARD_TEST_FRAMEWORKS=$dir"
    ( install "$dir" || true ) < /dev/null > /dev/null 2>&1 &
    ;;
  install)
    install "$(realpath -m "$2")"
    ;;
  *)
    echo "usage: $0 start|install DIR" >&2
    exit 2
    ;;
esac
