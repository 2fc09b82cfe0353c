# Sourced by scripts/install-venv.sh and scripts/build-image.sh, which hand this machine's pip
# settings (pip.conf and PIP_* variables) on to uv and to the image's pip.
#
#   pip_setting LISTING KEY   the value `pip config list` (LISTING) gives KEY: the last line
#                             that sets it, as pip's later scopes override its earlier ones.
pip_setting() {
    printf '%s\n' "$1" | sed -n "s/^[^.]*\.$2='\(.*\)'$/\1/p" | tail -1
}
