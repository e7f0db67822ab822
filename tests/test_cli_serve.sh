#!/usr/bin/env bash
# test_cli_serve — `kvtier serve` / `kvtierd` as an operator runs it: its
# help and its answers to bad flags; the socket it creates (mode 0660); a
# second daemon on a live socket refused, a stale socket file replaced;
# options from a config file and KVT_* below the flags; readiness to
# systemd (NOTIFY_SOCKET) when python3 is there to listen; SIGTERM drains
# and exits 0, removing its socket; SIGINT the same.
. "$(dirname "$0")/cli_lib.sh" serve "$@"
KVTD=$(dirname "$KVT")/kvtierd
SOCK=/tmp/kvtd-cli-$$.sock
MODEL=$TMP/model.json
echo '{"num_hidden_layers":4,"num_attention_heads":2,"hidden_size":128,"num_key_value_heads":2,"torch_dtype":"bfloat16"}' >"$MODEL"
ARGS=(--socket "$SOCK" --tiers dram:2M --model "$MODEL" --page-tokens 4)

"$KVT" serve --help | grep -q -- "--tenants" || fail "serve --help"
[ -x "$KVTD" ] && "$KVTD" --help | grep -q "kvtierd" || fail "kvtierd --help"
expect 2 "no tiers" -- serve --socket "$SOCK" --model "$MODEL"
expect 2 "unexpected argument" -- serve now
expect 2 "--load-method 'memcpy'" -- serve "${ARGS[@]}" --load-method memcpy
expect 2 "--store-method 'cpu'" -- serve "${ARGS[@]}" --store-method cpu
expect 2 "--lease-ms" -- serve "${ARGS[@]}" --lease-ms 0
expect 2 "--thread-nice" -- serve "${ARGS[@]}" --thread-nice 20
expect 2 "tp" -- serve "${ARGS[@]}" --tp zero
expect 2 "unknown model" -- serve --socket "$SOCK" --tiers dram:2M --model gpt-17
expect 2 "tenants" -- serve "${ARGS[@]}" --tenants "nocolon"
expect 2 "tenants" -- serve "${ARGS[@]}" --tenants "a:1,uid=x"
expect 2 "given twice" -- serve "${ARGS[@]}" --tenants "a:1;b:1"
expect 2 "unknown or repeated field" -- serve "${ARGS[@]}" --tenants "a:1,color=red"
expect 2 "is not TIER:SIZE" -- serve "${ARGS[@]}" --tenants "a:1,quota=dram"
expect 2 "is not TIER:SIZE" -- serve "${ARGS[@]}" --tenants "a:1,quota=hbm:1G"
expect 2 "is not TIER:SIZE" -- serve "${ARGS[@]}" --tenants "a:1,quota=dram:lots"
expect 2 "not in --tiers" -- serve "${ARGS[@]}" --tenants "a:1,quota=ssd:1G"
expect 2 "too long" -- serve --socket "/tmp/$(printf 'x%.0s' {1..120})" --tiers dram:2M --model "$MODEL" --page-tokens 4
expect 1 "" -- serve --socket /nonexistent/dir/s.sock --tiers dram:2M --model "$MODEL" --page-tokens 4

wait_sock() {
	for _ in $(seq 200); do [ -S "$SOCK" ] && return 0; sleep 0.05; done
	return 1
}

# start, refuse a second, drain on SIGTERM
"$KVT" serve "${ARGS[@]}" --thread-nice 5 2>"$TMP/d1.err" &
D=$!
wait_sock || fail "no socket at $SOCK ($(cat "$TMP/d1.err"))"
# --thread-nice: the cache's threads at 5 (they set it as they start), the
# daemon's own thread as started (nice: field 19 of /proc/TID/stat)
nice_of() { sed 's/.*) //' "$1" 2>/dev/null | cut -d' ' -f17; }
for _ in $(seq 100); do
	n5=0
	for t in /proc/$D/task/*/stat; do [ "$(nice_of "$t")" = 5 ] && n5=$((n5 + 1)); done
	[ "$n5" -ge 3 ] && break
	sleep 0.02
done
[ "$n5" -ge 3 ] || fail "--thread-nice 5: $n5 threads at nice 5"
[ "$(nice_of /proc/$D/stat)" = 0 ] || fail "--thread-nice moved the daemon's own thread"
[ "$(stat -c %a "$SOCK")" = 660 ] || fail "socket mode $(stat -c %a "$SOCK"), want 660"
expect 1 "already serving" -- serve "${ARGS[@]}"
# kvtier stat asks it over the socket (a monitor: no geometry)
"$KVT" stat --socket "$SOCK" >"$TMP/stat.txt" 2>&1 || fail "stat: $(cat "$TMP/stat.txt")"
grep -q "clients 1" "$TMP/stat.txt" || fail "stat output: $(head -3 "$TMP/stat.txt")"
"$KVT" stat --socket "$SOCK" --json | grep -q '"format":' || fail "stat --json"
expect 1 "no daemon" -- stat --socket /tmp/kvtd-none-$$.sock
kill -TERM $D; wait $D; rc=$?
[ $rc = 0 ] || fail "SIGTERM: exit $rc ($(cat "$TMP/d1.err"))"
[ -e "$SOCK" ] && fail "socket left behind after SIGTERM"
grep -q "draining" "$TMP/d1.err" || fail "no drain message"

# a stale socket file (a daemon killed -9) is replaced; config file and
# environment under the flags; SIGINT drains too
"$KVT" serve "${ARGS[@]}" 2>/dev/null &
D=$!
wait_sock || fail "no socket"
kill -KILL $D; wait $D 2>/dev/null
[ -S "$SOCK" ] || fail "kill -9 should leave the socket file"
printf 'tiers = dram:3M\nlease_ms = 5000\nnamespace = fromfile\n' >"$TMP/d.conf"
KVT_NAMESPACE=fromenv "$KVTD" --config "$TMP/d.conf" --socket "$SOCK" --model "$MODEL" --page-tokens 4 2>"$TMP/d2.err" &
D=$!
for _ in $(seq 200); do grep -q serving "$TMP/d2.err" && break; sleep 0.05; done
grep -q "serving fromenv on $SOCK (tiers dram:3M)" "$TMP/d2.err" || fail "config/env precedence: $(cat "$TMP/d2.err")"
kill -INT $D; wait $D; rc=$?
[ $rc = 0 ] || fail "SIGINT: exit $rc"

# readiness to systemd
if command -v python3 >/dev/null; then
	NS=$TMP/notify.sock
	python3 - "$NS" >"$TMP/notify.out" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1]); s.settimeout(20)
for _ in range(2):
    print(s.recv(256).decode(), flush=True)
PY
	L=$!
	for _ in $(seq 100); do [ -S "$NS" ] && break; sleep 0.05; done
	NOTIFY_SOCKET=$NS "$KVT" serve "${ARGS[@]}" 2>/dev/null &
	D=$!
	wait_sock || fail "no socket (notify run)"
	sleep 0.2
	kill -TERM $D; wait $D
	wait $L
	grep -q "READY=1" "$TMP/notify.out" || fail "no READY=1 to NOTIFY_SOCKET"
	grep -q "STOPPING=1" "$TMP/notify.out" || fail "no STOPPING=1 to NOTIFY_SOCKET"
fi
# the benchmark, small: two client processes, a short load test, JSON,
# no hang at the end
timeout 120 "$KVT" bench server --model "$MODEL" --page-tokens 4 --pages 8 --clients 2 --repeats 2 --reps 50 --load-clients 2 --load-seconds 1 --json >"$TMP/bench.json" 2>"$TMP/bench.err" || fail "bench server exit $? ($(tail -2 "$TMP/bench.err"))"
for k in '"daemon_gbps":' '"inproc_gbps":' '"load_ratio_vs_inprocess":' '"lookup_us_p50":' '"lookup_us_p99":' '"hash_us_p50":' '"throughput_rps":' '"errors":	0' '"goal_met":' '"clients":	2'; do
	grep -qF "$k" "$TMP/bench.json" || fail "bench server json lacks $k"
done
expect 2 "--clients" -- bench server --clients 0
expect 2 "device 'nosuch'" -- bench server --device nosuch
rm -f "$SOCK"
[ "$fails" = 0 ] && echo "all serve cli checks passed"
exit $((fails > 0))
