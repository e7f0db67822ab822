#!/usr/bin/env bash
# test_cli_stat — kvtier stat's formatter on metrics JSON from the daemon's
# renderer (tests/metrics_sample.json: made by src/server/metrics_json.c's
# kvtd_metrics_render_json over a real cache; test_metrics checks it still
# has every field the renderer writes), --watch/--count, and bad input.
. "$(dirname "$0")/cli_lib.sh" stat "$@"
SAMPLE=${KVT_SOURCE_DIR:-$(dirname "$0")/..}/tests/metrics_sample.json

has() { # has FILE NEEDLE...: every needle is in FILE
	local f=$1; shift
	for n in "$@"; do
		grep -qF -- "$n" "$f" || fail "$f lacks '$n'"
	done
}

"$KVT" stat --from-file "$SAMPLE" >"$TMP/table.txt" || fail "stat --from-file"
has "$TMP/table.txt" "kvtier daemon 0." "clients 3, leases 7 (56 pages pinned)" \
	"jobs in flight 1, engine memory registered 3.00 GiB" "cache: pages loaded 0" "dram         2.00 MiB" "0/1024" \
	"tenant alice (id 1): 1606 pages looked up, hit rate 94.0%, 96 misses" \
	"ssd->engine 1.20 GiB" "lease expiries: disconnect 3" "180/200" \
	"tenant bob (id 2): 576 pages looked up, hit rate 11.1%, 512 misses" \
	"protocol errors: not_owner 1" "protocol errors: truncated 1, idle 1" \
	"node (no tenant" "dram->ssd 480.00 MiB" \
	"remote: pages hit 192, missed 8, stored 256" "bad values 2 (failed MAC/checksum"
# the data path: the restore path's CPU copies, movers by flow, the devices
has "$TMP/table.txt" "data path: restore bytes copied by a CPU 0 B; device checksums 2048, failed 1" \
	"device emu:0 (emulated: CPU copies): copy engines 128.00 MiB, kernels 256.00 MiB" \
	"faults 0, allocations open 1" \
	"device jobs by another method than chosen (batched copies not built: one copy per chunk): 2"
grep -qE "^  save +0 B +0 B +128.00 MiB +0 B " "$TMP/table.txt" || fail "the save row"
# read failures and checksum failures are their own columns, apart from misses
grep -qE "^  ssd +310 +2 +0 +0 +1 " "$TMP/table.txt" || fail "alice's ssd row"
# latency: counts, and p50 <= p99 from the buckets
grep -qE "^  lookup +1000 +[0-9.]+ us +[0-9.]+ us" "$TMP/table.txt" || fail "lookup latency row"
grep -qE "^  store +100 +[0-9.]+ ms" "$TMP/table.txt" || fail "store latency row"

# quantiles as histogram_quantile(): linear inside the bucket the rank falls in
cat >"$TMP/q.json" <<'JSON'
{"format": 1, "version": "t", "time": 3725, "start_time": 0, "gauges": {}, "tiers": [],
 "cache": null, "buckets": [1e-6, 2e-6, 5e-6],
 "tenants": [{"id": 4, "name": "q", "misses": 0, "tiers": {}, "transfer_bytes": [],
   "lease_expiries": {}, "protocol_errors": {},
   "latency": {"lookup": {"count": 10, "sum_seconds": 1.5e-5, "cumulative": [0, 10, 10, 10]},
               "load": {"count": 4, "sum_seconds": 100, "cumulative": [0, 0, 2, 4]}}}]}
JSON
"$KVT" stat --from-file "$TMP/q.json" >"$TMP/q.txt" || fail "stat on a hand-made histogram"
grep -qE "^  lookup +10 +1.5 us +2.0 us +1.5 us$" "$TMP/q.txt" || fail "lookup p50/p99/mean: $(grep lookup "$TMP/q.txt")"
grep -qE "^  load +4 +5.0 us +> 5.0 us +25.00 s$" "$TMP/q.txt" || fail "load quantiles past the last bound: $(grep load "$TMP/q.txt")"
grep -q "up 1h02m05s" "$TMP/q.txt" || fail "uptime"
grep -q "tenant q (id 4): no lookups" "$TMP/q.txt" || fail "a tenant without lookups"

# a format-1 document with every member of the wrong type: printed as far
# as it goes, no crash
cat >"$TMP/odd.json" <<'JSON'
{"format": 1, "version": 7, "time": "x", "gauges": [], "tiers": {"a": 1}, "cache": [],
 "buckets": {}, "tenants": [{"id": "x", "name": 5, "misses": "y", "tiers": [1, {"hits": "z"}],
   "transfer_bytes": {"a": 1}, "lease_expiries": [1, 2], "protocol_errors": "no",
   "latency": [{"count": 3, "cumulative": [1]}]}, 7, "s"]}
JSON
"$KVT" stat --from-file "$TMP/odd.json" >"$TMP/odd.txt" 2>&1; rc=$?
[ $rc -le 1 ] || fail "stat on odd JSON: exit $rc: $(cat "$TMP/odd.txt")"

"$KVT" stat --from-file "$SAMPLE" --tenant bob >"$TMP/bob.txt" || fail "stat --tenant bob"
has "$TMP/bob.txt" "tenant bob"
grep -q "tenant alice" "$TMP/bob.txt" && fail "--tenant bob shows alice"
"$KVT" stat --from-file "$SAMPLE" --json >"$TMP/out.json" || fail "stat --json"
has "$TMP/out.json" '"format":	1' '"tenants":' '"cumulative":'

# --watch: one table per refresh, --count stops it; JSON lines with --json
"$KVT" stat --from-file "$SAMPLE" --watch 0.1 --count 3 >"$TMP/watch.txt" || fail "stat --watch"
[ "$(grep -c '^kvtier daemon' "$TMP/watch.txt")" = 3 ] || fail "--watch --count 3 printed $(grep -c '^kvtier daemon' "$TMP/watch.txt") tables"
"$KVT" stat --from-file "$SAMPLE" --json --watch 0.1 --count 2 >"$TMP/watch.json" || fail "stat --json --watch"
[ "$(grep -c '^{"format":1,' "$TMP/watch.json")" = 2 ] || fail "--json --watch: not 2 JSON lines"
# an interrupted --watch ends cleanly
"$KVT" stat --from-file "$SAMPLE" --watch 0.2 >/dev/null & pid=$!
sleep 0.5; kill -INT $pid; wait $pid; rc=$?
[ $rc = 0 ] || fail "--watch interrupted: exit $rc"

"$KVT" stat --help | grep -q -- "--watch SECS" || fail "stat --help"
"$KVT" --help | grep -q "stat " || fail "kvtier --help lacks stat"

# bad input
printf 'not json' >"$TMP/garbage.json"
printf '{"format": 2}' >"$TMP/future.json"
expect 2 "--watch: '0' is not a number" -- stat --from-file "$SAMPLE" --watch 0
expect 2 "--watch: 'abc'" -- stat --watch abc
expect 2 "--count: '0'" -- stat --watch 1 --count 0
expect 2 "--count needs --watch" -- stat --count 2
expect 2 "unexpected argument 'x'" -- stat x
expect 2 "--socket: empty path" -- stat --socket ""
expect 2 "exclude each other" -- stat --socket /x --from-file "$SAMPLE"
expect 2 "--tenant selects rows" -- stat --json --tenant a
expect 2 "unrecognized option" -- stat --bogus
expect 1 "No such file" -- stat --from-file "$TMP/absent.json"
expect 1 "not valid JSON" -- stat --from-file "$TMP/garbage.json"
expect 1 "metrics format 2, this kvtier reads format 1" -- stat --from-file "$TMP/future.json"
expect 1 "no tenant 'nobody'" -- stat --from-file "$SAMPLE" --tenant nobody
expect 1 "kvtier stat" -- stat --socket "$TMP/no-daemon.sock"
# against a live daemon, where this kvtier has one: stat over the socket, and
# GET /metrics (bash's /dev/tcp) on a loopback port; bounded by timeouts
if "$KVT" serve --help >/dev/null 2>&1; then
	http() { # http METHOD PATH: the whole response on stdout
		exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
		printf '%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n' "$1" "$2" >&3
		timeout 10 cat <&3
		exec 3<&-
	}
	for try in 1 2 3; do # a random port may be taken: try another
		port=$((20000 + RANDOM % 30000))
		rm -f "$TMP/d.sock"
		"$KVT" serve --socket "$TMP/d.sock" --tiers dram:64M \
			--metrics "127.0.0.1:$port" >"$TMP/serve.log" 2>&1 & dpid=$!
		for i in $(seq 100); do
			[ -S "$TMP/d.sock" ] || ! kill -0 $dpid 2>/dev/null && break
			sleep 0.1
		done
		kill -0 $dpid 2>/dev/null && break
		wait $dpid
	done
	if kill -0 $dpid 2>/dev/null; then
		timeout 20 "$KVT" stat --socket "$TMP/d.sock" >"$TMP/live.txt" 2>&1 ||
			fail "stat on a live daemon: $(cat "$TMP/live.txt")"
		has "$TMP/live.txt" "kvtier daemon" "dram " "tenant default"
		timeout 20 "$KVT" stat --socket "$TMP/d.sock" --json >"$TMP/live.json" 2>&1 ||
			fail "stat --json on a live daemon"
		has "$TMP/live.json" '"format":	1' '"tiers":'
		KVT_NAMESPACE=other timeout 20 "$KVT" stat --socket "$TMP/d.sock" >/dev/null 2>"$TMP/ns.err"
		[ $? = 1 ] && grep -q "namespace 'other' is not served here" "$TMP/ns.err" ||
			fail "stat in another namespace: $(cat "$TMP/ns.err")"
		printf 'socket = %s\n' "$TMP/d.sock" >"$TMP/stat.conf"
		timeout 20 "$KVT" stat --config "$TMP/stat.conf" --tenant default >"$TMP/conf.txt" 2>&1 ||
			fail "stat --config: $(cat "$TMP/conf.txt")"
		KVT_SOCKET="$TMP/d.sock" timeout 20 "$KVT" stat --count 2 --watch 0.1 >"$TMP/env.txt" 2>&1 ||
			fail "stat with KVT_SOCKET: $(cat "$TMP/env.txt")"
		[ "$(grep -c '^kvtier daemon' "$TMP/env.txt")" = 2 ] || fail "live --watch --count 2"
		http GET /metrics >"$TMP/scrape.txt" || fail "GET /metrics"
		has "$TMP/scrape.txt" "HTTP/1.1 200" "text/plain; version=0.0.4" \
			"# TYPE kvtier_hits_total counter" 'kvtier_tier_capacity_bytes{tier="dram"} 67108864'
		http GET /other | grep -q "HTTP/1.1 404" || fail "GET /other is not 404"
		http POST /metrics | grep -q "HTTP/1.1 405" || fail "POST /metrics is not 405"
		kill -TERM $dpid; wait $dpid || fail "daemon exit $?: $(cat "$TMP/serve.log")"
	else
		fail "no daemon started: $(cat "$TMP/serve.log")"
	fi
	expect 2 "metrics address" -- serve --socket "$TMP/e.sock" --tiers dram:64M --metrics 127.0.0.1:99999
fi
exit $((fails > 0))
