#!/usr/bin/env bash
# test_cli_demo — `kvtier demo` as a user runs it, reduced: the table, the
# JSON, --quiet, and its answers to bad flags. Leaves no files behind.
. "$(dirname "$0")/cli_lib.sh" demo "$@"
export TMPDIR=$TMP
SMALL="--sessions 2 --turns 3 --system 64 --context 256 --turn-tokens 128 --output 32"

"$KVT" demo $SMALL >"$TMP/out.txt" 2>"$TMP/err.txt" || fail "demo exit $? ($(tail -2 "$TMP/err.txt"))"
for s in "MEASURED" "MODELED" "cold" "warm 2" "lmcache" "kvtier" "TTFT ms" \
	 "Nothing lost or corrupted" "EMULATED" "compute" "request by request"; do
	grep -qF "$s" "$TMP/out.txt" || fail "table lacks '$s'"
done

"$KVT" demo $SMALL --json >"$TMP/out.json" 2>"$TMP/err.txt" || fail "demo --json exit $?"
for k in '"ok":	true' '"passes":' '"policy":	"lmcache"' '"policy":	"kvtier"' \
	 '"ttft_ms":' '"p90":' '"restore_gbps":' '"hit_tokens":' '"computed_tokens":' \
	 '"final_bad":	0' '"move_errors":	0' '"evicted_pages":' '"paired_warm":'; do
	grep -qF "$k" "$TMP/out.json" || fail "json lacks $k"
done

out=$("$KVT" demo $SMALL --quiet --policy kvtier 2>&1) || fail "demo --quiet exit $?"
[ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "--quiet printed more than one line: $out"
grep -q "0 bad" <<<"$out" || fail "--quiet summary: $out"

"$KVT" demo $SMALL --stress 1 --stress-bytes 8M --quiet >/dev/null 2>&1 || fail "demo --stress"
"$KVT" demo --help | grep -q -- "--sessions" || fail "demo --help"

expect 2 "--sessions" -- demo --sessions 0
expect 2 "--policy" -- demo --policy fastest
expect 2 "--hbm" -- demo --hbm lots
expect 2 "unknown model" -- demo --model gpt-17
expect 2 "unexpected argument" -- demo now
expect 1 "cannot hold one session" -- demo $SMALL --hbm 64K

left=$(find "$TMP" -mindepth 1 -not -name 'out.*' -not -name 'err.txt' | head -3)
[ -z "$left" ] || fail "files left behind: $left"
[ "$fails" = 0 ] && echo "all demo cli checks passed"
exit $((fails > 0))
