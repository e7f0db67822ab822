#!/usr/bin/env bash
# test_cli_demo_out — `kvtier demo --out FILE`, the JSON kept on disk after
# every pass: a small sweep killed with SIGTERM once a pass has finished
# leaves FILE whole (it parses, "complete": false, the passes it says it
# holds, no FILE.tmp) and no temporary files (the cut pass cleans up, the
# process ends by the signal: 143); a run that ends leaves --json's document plus
# "complete": true (compared whole with python3 json: the same run);
# a FILE that cannot be written fails at start with exit 2; the progress
# line (on a terminal: script(1)) shows the elapsed time and the time left.
# A few seconds; leaves no files behind.
. "$(dirname "$0")/cli_lib.sh" demo_out "$@"
export TMPDIR=$TMP
SMALL="--sessions 2 --turns 2 --system 64 --context 256 --turn-tokens 128 --output 4 --rate 20 --think 0.05"

# 1. killed mid-sweep: 2 policies x 2 rates x 6 repeats = 24 passes
OUT=$TMP/sweep.json
timeout 120 "$KVT" demo $SMALL --policy vllm,kvtier --rates 10,40 --repeat 6 \
	--quiet --out "$OUT" >/dev/null 2>"$TMP/err.txt" &
pid=$!
# the file is written before the first pass (passes_done 0): wait for one
# that holds a finished pass
for _ in $(seq 600); do
	[ -s "$OUT" ] && [ "$(jq -r .passes_done "$OUT" 2>/dev/null)" -ge 1 ] 2>/dev/null && break
	kill -0 $pid 2>/dev/null || break
	sleep 0.05
done
kill -TERM $pid 2>/dev/null
wait $pid
rc=$?
[ "$rc" = 143 ] || fail "demo not ended by SIGTERM mid-sweep (exit $rc: it finished first, or failed: $(tail -2 "$TMP/err.txt"))"
[ -e "$OUT.tmp" ] && fail "SIGTERM left $OUT.tmp behind"
grep -q "stopped by signal 15" "$TMP/err.txt" || fail "no stop message: $(tail -2 "$TMP/err.txt")"
# the cut pass closed its tiers: no temporary directory, no ssd file left
left=$(find "$TMP" -name 'kvtier-demo-*' -o -name '*.kvt' | head -3)
[ -z "$left" ] || fail "SIGTERM left the run's temporary files: $left"
python3 - "$OUT" <<'EOF' || fail "partial file checks"
import json, sys
d = json.load(open(sys.argv[1]))          # whole: it parses
assert d["complete"] is False, d["complete"]
assert d["passes_total"] == 24, d["passes_total"]
assert 1 <= d["passes_done"] < 24, d["passes_done"]
assert len(d["passes"]) == d["passes_done"], (len(d["passes"]), d["passes_done"])
assert d["config"]["repeat"] == 6
assert d["ok"] is True
# repeats_done: the repeats every (policy, rate) of which ran; what is
# derived comes from them, null before the first is whole
rd = d["repeats_done"]
assert rd == d["passes_done"] // 4, (rd, d["passes_done"])
for k in ("throughput_at_equal_ttft", "goals"):
    assert k in d, k
    assert (d[k] is None) == (rd == 0), (k, rd, d[k])
# the order: repeat by repeat, each (policy, rate) once per repeat
seen = [(p["repeat"], p["policy"], p["rate"]) for p in d["passes"]]
assert len(set(seen)) == len(seen), seen
assert [r for r, _, _ in seen] == sorted(r for r, _, _ in seen), seen
for p in d["passes"]:
    assert p["requests_run"] == p["requests"], p
EOF

# 2. a run that ends: the file is --json's document plus "complete": true
OUT=$TMP/done.json
timeout 120 "$KVT" demo $SMALL --policy vllm,kvtier --rates 10,40 --json \
	--out "$OUT" >"$TMP/stdout.json" 2>"$TMP/err.txt" ||
	fail "demo --json --out exit $? ($(tail -2 "$TMP/err.txt"))"
[ -e "$OUT.tmp" ] && fail "$OUT.tmp left behind"
python3 - "$OUT" "$TMP/stdout.json" <<'EOF' || fail "final file differs from --json"
import json, sys
f = json.load(open(sys.argv[1]))
j = json.load(open(sys.argv[2]))
assert f.pop("complete") is True
for k in ("passes_done", "passes_total", "repeats_done"):
    assert k not in f, k
assert f == j, sorted(k for k in set(f) | set(j) if f.get(k) != j.get(k))
assert len(f["passes"]) == 4 and "throughput_at_equal_ttft" in f
EOF

# 3. a bad FILE: a clear error before any pass, exit 2, nothing made
expect 2 "its directory must exist" -- demo $SMALL --out "$TMP/no/such/dir/x.json"
expect 2 "is a directory" -- demo $SMALL --out "$TMP"
if [ "$(id -u)" != 0 ]; then
	mkdir "$TMP/ro" && chmod 555 "$TMP/ro"
	expect 2 "cannot write" -- demo $SMALL --out "$TMP/ro/x.json"
	chmod 755 "$TMP/ro"
fi
"$KVT" demo --help | grep -q -- "--out FILE" || fail "demo --help lacks --out"

# 4. the progress line on a terminal: elapsed and left
if command -v script >/dev/null; then
	script -qec "timeout 120 $KVT demo $SMALL --policy vllm,kvtier --rates 10,40 2>&1 >/dev/null" \
		/dev/null >"$TMP/tty.txt" 2>&1
	grep -qE "pass 4/4 .* elapsed, ~[0-9]+s left" "$TMP/tty.txt" ||
		fail "progress line lacks elapsed / left: $(tr '\r' '\n' <"$TMP/tty.txt" | tail -3)"
fi

rm -rf "$TMP"
exit $((fails > 0))
