# Sourced by the tests/tools/check_*.sh scripts that take (SOURCE_DIR PYTHON): sets src and py
# from them, strict mode, a scratch folder $tmp removed at exit, and fail(), which prints a FAIL
# line and marks the run failed ($bad; the script ends with `exit $bad`).
set -uo pipefail
src=$1
py=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
fail() { echo "FAIL: $*"; bad=1; }
