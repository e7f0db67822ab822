# cli_lib.sh — the shared top of the command-line tests (tests/test_cli_*.sh),
# sourced as:   . "$(dirname "$0")/cli_lib.sh" NAME "$@"
#
# Sets KVT (the kvtier binary, the test's first argument) and TMP (an empty
# scratch directory), and defines:
#   fail MESSAGE...            count a failure and say what it was
#   expect EXIT NEEDLE -- ARGS run `kvtier ARGS`: its exit status must be EXIT
#                              and its stderr must contain NEEDLE
# A test ends with:   exit $((fails > 0))
set -u
KVT=${2:?usage: test_cli_$1.sh path/to/kvtier}
TMP=${KVT_TEST_TMP:-/tmp}/test-scratch/cli-$1
rm -rf "$TMP" && mkdir -p "$TMP"
fails=0

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

expect() {
	local want=$1 needle=$2; shift 3
	local out rc
	out=$("$KVT" "$@" 2>&1 >/dev/null); rc=$?
	if [ "$rc" != "$want" ] || ! grep -qF -- "$needle" <<<"$out"; then
		fail "kvtier $* -> exit $rc (want $want), stderr: $out"
	fi
}
