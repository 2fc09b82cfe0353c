#!/usr/bin/env bash
# Installs constraints.txt's locked set into the venv given: `make install` (the project's
# requirements, its dev extras' and the project itself, editable) or, with --image, the
# image's dependency layer (the Dockerfile: the lines not marked dev-only, before any source).
# The lines marked gpu-image-only (TensorFlow's CUDA libraries) only the GPU image installs.
#
# 1. uv installs the lock as it stands (--no-deps: constraints.txt is the whole resolved set),
#    downloading in parallel (and, for .venv, byte-compiling on every core): a fresh install
#    in well under half of pip's time on 2 cores, the image's part in about a quarter of the
#    time pip took to resolve and install it (bench/RESULTS.md, "The install and the image"
#    and "the image's install with uv");
# 2. pip installs the releases marked `requires-python-excluded` in constraints.txt, whose
#    metadata excludes the Python they run on here (uv has no --ignore-requires-python),
#    and, for .venv, this project;
# 3. for .venv, `pip check` fails the install if an installed release's requirements (this
#    project's install_requires among them) are not all met.
#
# uv is given the indexes and find-links folders pip is configured with (pip.conf and PIP_*
# variables: the machine's wheel of PyTorch's CPU build, say, or the image build's
# arguments), and takes the best match across them, as pip does (uv's default stops at the
# first index that has a package at all).
#
# With --image (settings from the environment, as the Dockerfile's build arguments):
#   TF_PACKAGE     the wheel installed for the lock's `tensorflow` (tensorflow-cpu: the same
#                  module without the CUDA kernels the image has no CUDA libraries to run;
#                  `tensorflow[and-cuda]`, the GPU image's: the pinned wheel, and the lines
#                  marked gpu-image-only, the extra's resolved set, as its CUDA libraries)
#   DROP_PACKAGES  names left out though the resolved set holds them (the Dockerfile says why)
# uv runs from a folder of its own and keeps no cache (both removed after), and nothing is
# byte-compiled.
#
#   bash scripts/install-venv.sh [--image] VENV
set -euo pipefail
cd "$(dirname "$0")/.."
image=0
if [ "${1:-}" = --image ]; then image=1; shift; fi
venv=${1:?usage: install-venv.sh [--image] VENV}
bin=$venv/bin
marker='requires-python-excluded'

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ $image = 1 ]; then
    "$bin/pip" install -q --no-compile --target "$work/uv" -c constraints.txt uv
    uv=$work/uv/bin/uv
    # The lock's lines for the image, names compared as pip normalizes them.
    lock() {
        awk -v drop=" ${DROP_PACKAGES:-} " -v tf="${TF_PACKAGE:-tensorflow}" '
            /^[A-Za-z0-9]/ && !/dev-only/ {
                if (/gpu-image-only/ && index(tf, "[and-cuda]") == 0) next
                name = tolower($1); sub(/==.*/, "", name); gsub(/[._]+/, "-", name)
                if (index(drop, " " name " ")) next
                if (name == "tensorflow") sub(/^[^=]*/, tf)
                print
            }' constraints.txt
    }
    options=(--no-cache)
else
    "$bin/pip" install -q -c constraints.txt uv
    uv=$bin/uv
    lock() { awk '!(/^[A-Za-z0-9]/ && /gpu-image-only/)' constraints.txt; }
    options=(--compile-bytecode)
fi

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
cert=$(pip_setting "$conf" cert)

lock | grep -v -- "$marker" >"$work/requirements.txt"
# pip's CA bundle (a TLS-intercepting proxy's) for uv too; uv's own roots otherwise.
env ${cert:+SSL_CERT_FILE="$cert"} "$uv" pip install -q --python "$bin/python" --no-deps \
    "${options[@]}" --index-strategy unsafe-best-match "${sources[@]}" \
    -r "$work/requirements.txt"

excluded=$(lock | sed -n "s/^\([^#[:space:]]*\).*$marker.*/\1/p")
if [ $image = 1 ]; then
    # shellcheck disable=SC2086
    "$bin/pip" install -q --no-compile --no-deps --ignore-requires-python $excluded
else
    # shellcheck disable=SC2086
    "$bin/pip" install -q --no-deps --ignore-requires-python -c constraints.txt $excluded -e .
    "$bin/pip" check
fi
