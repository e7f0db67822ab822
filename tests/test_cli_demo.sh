#!/usr/bin/env bash
# test_cli_demo — `kvtier demo` as a user runs it, reduced: the table (every
# policy), the JSON with a sweep (its fields; throughput at equal TTFT; TTFT
# never below the engine's first step), --quiet, --plot, --daemon, a run
# whose ssd files are overwritten mid-way (the summary must say so), in
# process and through the daemon, a block spoiled in engine memory, a run
# killed with SIGKILL (no ssd data left), and its answers to bad flags.
# Leaves no files behind.
. "$(dirname "$0")/cli_lib.sh" demo "$@"
export TMPDIR=$TMP
# a hang (in the engine or the cache) fails the test in two minutes
demo() { timeout 120 "$KVT" demo "$@"; }
SMALL="--sessions 2 --turns 2 --system 64 --context 256 --turn-tokens 128 --output 4 --rate 20 --think 0.05"

demo $SMALL >"$TMP/out.txt" 2>"$TMP/err.txt" || fail "demo exit $? ($(tail -2 "$TMP/err.txt"))"
for s in "MEASURED" "MODELED" "lmcache " "lmcache-layerwise" "vllm" "kvtier" \
	 "TTFT ms" "verification failures: 0" "EMULATED" "tokens loaded from" \
	 "load average" "against each baseline" "recomp" "re-read in every tier"; do
	grep -qF "$s" "$TMP/out.txt" || fail "table lacks '$s'"
done

demo $SMALL --policy vllm,kvtier --rates 10,40 --json >"$TMP/out.json" 2>"$TMP/err.txt" ||
	fail "demo --json exit $? ($(tail -2 "$TMP/err.txt"))"
for k in '"ok":	true' '"policies":' '"kvtier":' '"vllm":' '"passes":' \
	 '"ttft_ms":' '"p50":' '"p90":' '"p99":' '"tpot_ms":' '"tokens_per_s":' \
	 '"loaded_tokens":' '"recomputed_tokens":' '"throughput_at_equal_ttft":' \
	 '"statistic":	"p90"' '"goals":' '"integrity":' '"final_bad":	0' \
	 '"bad":	0' '"load_gbps_measured":' '"loadavg":' '"rate":	40'; do
	grep -qF "$k" "$TMP/out.json" || fail "json lacks $k"
done
# every pass: its sessions x 2 turns, all run (a sweep's sessions grow with
# the rate: 1 at 10/s, 4 at 40/s); 0 < p50 <= p90 <= p99
python3 - "$TMP/out.json" <<'EOF' || fail "json checks"
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["passes"]) == 4, len(d["passes"])
for p in d["passes"]:
    t = p["ttft_ms"]
    assert p["requests_run"] == p["requests"] == 2 * p["sessions"], p
    assert p["sessions"] == {10: 1, 40: 4}[p["rate"]], p
    assert 0 < t["p50"] <= t["p90"] <= t["p99"], t
    assert p["tokens_per_s"] > 0
    assert p["data"]["final_bad"] == 0
for target, per in d["throughput_at_equal_ttft"].items():
    if target == "statistic":
        continue
    assert set(per) >= {"vllm", "kvtier"}, per
EOF

out=$(demo $SMALL --quiet --policy kvtier 2>&1) || fail "demo --quiet exit $?"
[ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "--quiet printed more than one line: $out"
grep -q " 0 bad" <<<"$out" || fail "--quiet summary: $out"

if command -v gnuplot >/dev/null; then
	demo $SMALL --policy lmcache,kvtier --rates 10,40 --plot "$TMP/curve.png" --quiet \
		>/dev/null 2>"$TMP/err.txt" || fail "demo --plot exit $? ($(tail -2 "$TMP/err.txt"))"
	[ -s "$TMP/curve.png" ] || fail "demo --plot wrote no PNG"
	rm -f "$TMP/curve.png"
fi

# ssd files overwritten after the first turns (the fault hook): exit 1, and
# neither the table nor the JSON claims a clean run
TAMPER="--sessions 4 --turns 3 --system 64 --context 500 --turn-tokens 300 --output 4 --rate 100 --think 0.1 --fabric 48M --dram 48M --policy kvtier"
KVT_DEMO_TAMPER=8 demo $TAMPER >"$TMP/out.txt" 2>"$TMP/err.txt"
[ $? = 1 ] || fail "tampered demo: exit status not 1"
grep -q "THE RUN FAILED" "$TMP/out.txt" || fail "tampered demo: no failure line"
grep -qF "verification failures: 0" "$TMP/out.txt" && fail "tampered demo: claims 0 failures"
KVT_DEMO_TAMPER=8 demo $TAMPER --json >"$TMP/out.json" 2>"$TMP/err.txt"
grep -qF '"ok":	false' "$TMP/out.json" || fail "tampered demo: json ok"
grep -qF '"error":' "$TMP/out.json" || fail "tampered demo: json error"
grep -qP '^\t\t"bad":\t0,?$' "$TMP/out.json" && fail "tampered demo: json bad 0"

# the same through the daemon: its ssd files have no names while open, the
# hook reaches them through the daemon child's descriptors
KVT_DEMO_TAMPER=8 demo $TAMPER --daemon >"$TMP/out.txt" 2>"$TMP/err.txt"
[ $? = 1 ] || fail "tampered demo --daemon: exit status not 1"
grep -q "overwrote [1-9][0-9]* ssd file" "$TMP/err.txt" || fail "tampered demo --daemon: the hook found no ssd file"
grep -q "THE RUN FAILED" "$TMP/out.txt" || fail "tampered demo --daemon: no failure line"
# a block spoiled in engine memory after its load: the engine's check fails
# the run, the cache's copies being right
KVT_DEMO_TAMPER_ENGINE=4 demo $TAMPER >"$TMP/out.txt" 2>"$TMP/err.txt"
[ $? = 1 ] || fail "engine-tampered demo: exit status not 1"
grep -q "wrong bytes" "$TMP/out.txt" "$TMP/err.txt" || fail "engine-tampered demo: no wrong-bytes error"
# killed with SIGKILL mid-run: no ssd data left behind (a 'temp' tier's
# files lose their names once open)
mkdir -p "$TMP/killed"
"$KVT" demo --sessions 60 --turns 3 --system 64 --context 500 --turn-tokens 300 --output 4 \
	--rate 20 --think 0.1 --fabric 48M --dram 48M --policy kvtier --dir "$TMP/killed" >/dev/null 2>&1 &
kpid=$!
seen=
for _ in $(seq 200); do
	ls -l /proc/$kpid/fd 2>/dev/null | grep -q 'kvtier-ssd-' && { seen=1; break; }
	sleep 0.05
done
[ -n "$seen" ] || fail "demo never opened its ssd tier (within 10 s)"
kill -9 $kpid 2>/dev/null
wait $kpid 2>/dev/null
find "$TMP/killed" -name 'kvtier-ssd-*' | grep -q . && fail "SIGKILLed demo left ssd files: $(find "$TMP/killed" -name 'kvtier-ssd-*' | head -3)"
rm -rf "$TMP/killed"

# --daemon: each policy's cache in a kvtierd child, the engine a client
demo $SMALL --policy lmcache,kvtier --daemon --json >"$TMP/out.json" 2>"$TMP/err.txt" ||
	fail "demo --daemon exit $? ($(tail -2 "$TMP/err.txt"))"
for k in '"ok":	true' '"daemon":	true' '"final_bad":	0' '"bad":	0'; do
	grep -qF "$k" "$TMP/out.json" || fail "demo --daemon json lacks $k"
done
grep -q '"final_checked":	[1-9]' "$TMP/out.json" || fail "demo --daemon: the daemon's final check read nothing"
ls /tmp/kvtier-demo-*.sock 2>/dev/null | grep -q . && fail "demo --daemon left a socket behind"
"$KVT" demo --help | grep -q -- "--sweep" || fail "demo --help"

expect 2 "--sessions" -- demo --sessions 0
expect 2 "--policy" -- demo --policy fastest
expect 2 "--hbm" -- demo --hbm lots
expect 2 "--rates" -- demo --rates 1,x
expect 2 "unknown model" -- demo --model gpt-17
expect 2 "unexpected argument" -- demo now
expect 1 "cannot hold one session" -- demo $SMALL --hbm 64K
expect 1 "cannot hold one session" -- demo $SMALL --fabric 1M
expect 1 "increasing" -- demo $SMALL --rates 4,2

left=$(find "$TMP" -mindepth 1 -not -name 'out.*' -not -name 'err.txt' | head -3)
[ -z "$left" ] || fail "files left behind: $left"
[ "$fails" = 0 ] && echo "all demo cli checks passed"
exit $((fails > 0))
