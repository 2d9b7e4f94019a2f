#!/usr/bin/env bash
# Set up booklens in ./.venv (offline-capable once installed).
#   ./install.sh          the package, the embedded model and its llama.cpp build
#   ./install.sh --test   also the test tools (pytest, and Chromium for the report tests)
set -euo pipefail
cd "$(dirname "$0")"
with_tests=0
[ "${1:-}" = "--test" ] && with_tests=1

python3 -m venv .venv
py=.venv/bin/python
# torch first and pinned: sentence-transformers would otherwise pull a multi-GB CUDA build.
"$py" -m pip install --quiet --disable-pip-version-check torch==2.13.0
# constraints.txt pins the dependency set we test with (it also spares pip a long backtrack).
# llama-cpp-python compiles from source the first time (minutes); pip caches the wheel.
if [ "$with_tests" = 1 ]; then
  "$py" -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "warning: could not install chromium; the report screenshot test will be skipped" >&2
    else
      echo "warning: chromium not found; the report screenshot test will be skipped" >&2
    fi
  fi
else
  "$py" -m pip install --quiet --disable-pip-version-check -c constraints.txt -e .
fi
echo "booklens installed in .venv ($(.venv/bin/booklens --help >/dev/null && echo ok))"
