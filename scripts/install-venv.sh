#!/usr/bin/env bash
# Installs constraints.txt's locked set (the project's requirements and its dev extras') and
# this project, editable, into the venv given, as `make install` does:
#
# 1. uv installs the lock as it stands (--no-deps: constraints.txt is the whole resolved set),
#    downloading in parallel and byte-compiling on every core (a fresh install in well under
#    half of pip's time on 2 cores: bench/RESULTS.md, "The install and the image");
# 2. pip installs the releases marked `requires-python-excluded` in constraints.txt, whose
#    metadata excludes the Python they run on here (uv has no --ignore-requires-python),
#    and this project;
# 3. `pip check` fails the install if an installed release's requirements (this project's
#    install_requires among them) are not all met.
#
# uv is given the indexes and find-links folders pip is configured with (the machine's wheel
# of PyTorch's CPU build, say), as scripts/build-image.sh gives them to the image's pip, and
# takes the best match across them, as pip does (uv's default stops at the first index that
# has a package at all).
#
#   bash scripts/install-venv.sh VENV
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: install-venv.sh VENV}
bin=$venv/bin
marker='requires-python-excluded'

"$bin/pip" install -q -c constraints.txt uv

. scripts/pip-settings.sh
sources=()
conf=$("$bin/pip" config list 2>/dev/null || true)
for key in index-url extra-index-url find-links; do
    value=$(pip_setting "$conf" "$key")
    for location in $value; do
        dir=${location#file://}
        case "$dir" in /*) [ -e "$dir" ] || continue ;; esac  # a missing folder: pip skips it
        sources+=("--$key" "$location")
    done
done

lock=$(mktemp)
trap 'rm -f "$lock"' EXIT
grep -v -- "$marker" constraints.txt >"$lock"
"$bin/uv" pip install -q --python "$bin/python" --no-deps --compile-bytecode \
    --index-strategy unsafe-best-match "${sources[@]}" -r "$lock"

excluded=$(sed -n "s/^\([^#[:space:]]*\).*$marker.*/\1/p" constraints.txt)
# shellcheck disable=SC2086
"$bin/pip" install -q --no-deps --ignore-requires-python -c constraints.txt $excluded -e .
"$bin/pip" check
