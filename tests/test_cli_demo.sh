#!/usr/bin/env bash
# test_cli_demo — `kvtier demo` as a user runs it, reduced: the table, the
# JSON (its fields, and TTFT never below its measured parts), --quiet, a run
# whose ssd files are overwritten mid-way (the summary must say so), and its
# answers to bad flags. Leaves no files behind.
. "$(dirname "$0")/cli_lib.sh" demo "$@"
export TMPDIR=$TMP
# a hang (in the cache) fails the test in two minutes, not at ctest's limit
demo() { timeout 120 "$KVT" demo "$@"; }
SMALL="--sessions 2 --turns 3 --system 64 --context 256 --turn-tokens 128 --output 32"

demo $SMALL >"$TMP/out.txt" 2>"$TMP/err.txt" || fail "demo exit $? ($(tail -2 "$TMP/err.txt"))"
for s in "MEASURED" "MODELED" "cold" "warm 2" "lmcache" "kvtier" "TTFT ms" \
	 "verification failures: 0" "EMULATED" "compute" "request by request" \
	 "block" "load" "save" "restored pages loaded"; do
	grep -qF "$s" "$TMP/out.txt" || fail "table lacks '$s'"
done

demo $SMALL --json >"$TMP/out.json" 2>"$TMP/err.txt" || fail "demo --json exit $?"
for k in '"ok":	true' '"passes":' '"policy":	"lmcache"' '"policy":	"kvtier"' \
	 '"ttft_ms":' '"p90":' '"components_ms_mean":' '"block_wait":' \
	 '"load_wait":' '"save":' '"prefill_ms_modeled":' '"restore_gbps":' \
	 '"hit_tokens":' '"computed_tokens":' '"requests":' '"integrity":' \
	 '"final_bad":	0' '"bad":	0' '"move_errors":	0' '"paired_warm":' \
	 '"ratio_p25":' '"engine_blocks":' '"drain_seconds":'; do
	grep -qF "$k" "$TMP/out.json" || fail "json lacks $k"
done
# every request: TTFT >= the sum of its measured parts, >= its modeled
# prefill, >= the time its last layer's data was ready; the turns' mean
# modeled prefill is not 0 (cJSON writes one key per line)
awk -F'\t' '
	function num(s) { gsub(/[",]/, "", s); return s + 0 }
	$0 ~ /"prefill_ms_modeled":/ { inmodel = 1 }
	inmodel && /"mean":/ { if (num($NF) <= 0) bad = bad " zero-modeled-mean"; inmodel = 0 }
	/"[a-z_]+_ms":\t[-0-9]/ { k = $(NF-1); gsub(/[":]/, "", k); v[k] = num($NF) }
	/"failed_pages":/ && ("ttft_ms" in v) {
		n++
		parts = v["lookup_ms"] + v["block_wait_ms"] + v["load_wait_ms"] + \
			v["prefill_ms"] + v["recompute_ms"] + v["save_ms"]
		if (v["ttft_ms"] < parts - 1e-3) bad = bad " parts>ttft"
		if (v["ttft_ms"] < v["prefill_modeled_ms"] - 1e-3) bad = bad " model>ttft"
		if (v["prefill_ms"] < v["prefill_modeled_ms"] - 1e-3) bad = bad " model>spent"
		if (v["ttft_ms"] < v["ready_ms"]) bad = bad " ready>ttft"
		delete v
	}
	END { if (n != 12) bad = bad " requests=" n; if (bad) { print bad; exit 1 } }
' "$TMP/out.json" || fail "json TTFT checks"

out=$(demo $SMALL --quiet --policy kvtier 2>&1) || fail "demo --quiet exit $?"
[ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "--quiet printed more than one line: $out"
grep -q " 0 bad" <<<"$out" || fail "--quiet summary: $out"

# ssd files overwritten after the first turn (the fault hook): exit 1, and
# neither the table nor the JSON claims a clean run
TAMPER="--sessions 3 --turns 4 --system 100 --context 300 --turn-tokens 200 --output 40 --fabric 48M --dram 32M --background none"
KVT_DEMO_TAMPER=12 demo $TAMPER >"$TMP/out.txt" 2>"$TMP/err.txt"
[ $? = 1 ] || fail "tampered demo: exit status not 1"
grep -q "THE RUN FAILED" "$TMP/out.txt" || fail "tampered demo: no failure line"
grep -qF "verification failures: 0" "$TMP/out.txt" && fail "tampered demo: claims 0 failures"
grep -qE " 0 bad\.|Nothing lost" "$TMP/out.txt" && fail "tampered demo: claims nothing bad"
KVT_DEMO_TAMPER=12 demo $TAMPER --json >"$TMP/out.json" 2>"$TMP/err.txt"
grep -qF '"ok":	false' "$TMP/out.json" || fail "tampered demo: json ok"
grep -qF '"error":' "$TMP/out.json" || fail "tampered demo: json error"
# checksum failures counted, not a clean "bad: 0"
grep -qP '^\t\t"bad":\t0,?$' "$TMP/out.json" && fail "tampered demo: json bad 0"

demo $SMALL --stress 1 --stress-bytes 8M --quiet >/dev/null 2>&1 || fail "demo --stress"
# --daemon: each policy's cache in a kvtierd child, the engine a client
demo $SMALL --daemon --json >"$TMP/out.json" 2>"$TMP/err.txt" || fail "demo --daemon exit $? ($(tail -2 "$TMP/err.txt"))"
for k in '"ok":	true' '"daemon":	true' '"final_bad":	0' '"bad":	0'; do
	grep -qF "$k" "$TMP/out.json" || fail "demo --daemon json lacks $k"
done
grep -q '"final_checked":	[1-9]' "$TMP/out.json" || fail "demo --daemon: the daemon's final check read nothing"
ls /tmp/kvtier-demo-*.sock 2>/dev/null | grep -q . && fail "demo --daemon left a socket behind"
"$KVT" demo --help | grep -q -- "--sessions" || fail "demo --help"

expect 2 "--sessions" -- demo --sessions 0
expect 2 "--policy" -- demo --policy fastest
expect 2 "--hbm" -- demo --hbm lots
expect 2 "unknown model" -- demo --model gpt-17
expect 2 "unexpected argument" -- demo now
expect 1 "cannot hold one session" -- demo $SMALL --hbm 64K
expect 1 "cannot hold one session" -- demo $SMALL --fabric 1M

left=$(find "$TMP" -mindepth 1 -not -name 'out.*' -not -name 'err.txt' | head -3)
[ -z "$left" ] || fail "files left behind: $left"
[ "$fails" = 0 ] && echo "all demo cli checks passed"
exit $((fails > 0))
