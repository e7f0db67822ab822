#!/usr/bin/env bash
# test_cli_xfer — kvtier bench xfer, kvtier bench cache --ssd [--direct] and
# kvtier stress from the command line: small runs that must succeed and print the documented JSON keys,
# and bad input that must fail with one message naming the bad part.
. "$(dirname "$0")/cli_lib.sh" xfer "$@"

# memory paths, with a stressor
"$KVT" bench xfer --tokens 64 --page-tokens 1,16 --repeat 2 --stress 1 \
	--stress-bytes 4M --json >"$TMP/mem.json" || fail "bench xfer --json"
for key in '"results"' '"method":	"cpu"' '"method":	"cpu+xxh3"' \
	   '"direction":	"load"' '"direction":	"store"' '"page_tokens":	16' \
	   '"bytes":' '"gbps":' '"limit_gbps":' '"ratio":' '"limit":	"memcpy"' \
	   '"target":' '"slowdown":' '"stressor_gbps":' '"checksum_cost":' \
	   '"engine"' '"copy_isa":'; do
	grep -qF "$key" "$TMP/mem.json" || fail "bench xfer --json lacks $key"
done
"$KVT" bench xfer --tokens 32 --page-tokens 32 --repeat 1 --methods cpu \
	--order seq --layout sglang --nt off --threads 1 >"$TMP/mem.txt" ||
	fail "bench xfer (text)"
grep -q "^cpu  *load  *32" "$TMP/mem.txt" || fail "bench xfer text lacks the cpu load row"
grep -q "cpu+xxh3" "$TMP/mem.txt" && fail "--methods cpu still ran cpu+xxh3"

# ssd paths against fio
"$KVT" bench xfer --tokens 64 --page-tokens 16 --repeat 1 --methods uring,pread \
	--ssd "$TMP/ssd" --uring-depth 4 --json >"$TMP/ssd.json" || fail "bench xfer --ssd"
for key in '"method":	"uring"' '"method":	"uring-thp"' '"method":	"pread"'; do
	grep -qF "$key" "$TMP/ssd.json" || fail "bench xfer --ssd lacks $key"
done
if command -v fio >/dev/null; then
	grep -qF '"limit":	"fio"' "$TMP/ssd.json" || fail "no fio limit"
	grep -qF '"limit_gbps":	null' "$TMP/ssd.json" && fail "fio ran but gave no limit"
fi
[ -z "$(ls -A "$TMP/ssd" 2>/dev/null)" ] || fail "bench xfer --ssd left files in $TMP/ssd"

# the stressor
"$KVT" stress --threads 2 --buffer-bytes 4M --seconds 0.3 --json >"$TMP/st.json" ||
	fail "stress --json"
for key in '"threads":	2' '"thread_gbps":' '"gbps":' '"samples":'; do
	grep -qF "$key" "$TMP/st.json" || fail "stress --json lacks $key"
done
# bench cache from the ssd, straight into engine memory (the demo's path):
# the transfer engine's rate of the loads is reported, no files are left
mkdir -p "$TMP/cssd"
"$KVT" bench cache --model llama-3.2-1b --tokens 256 --repeats 2 --ssd "$TMP/cssd" \
	--direct --json >"$TMP/cache.json" || fail "bench cache --ssd --direct"
for key in '"from":	"ssd"' '"staged":	false' '"xfer_gbps":	[0-9]' '"load_gbps":'; do
	grep -q "$key" "$TMP/cache.json" || fail "bench cache --direct json lacks $key"
done
"$KVT" bench cache --model llama-3.2-1b --tokens 256 --repeats 2 --ssd "$TMP/cssd" \
	--json >"$TMP/cache.json" || fail "bench cache --ssd"
for key in '"staged":	true' '"xfer_gbps":	[0-9]'; do
	grep -q "$key" "$TMP/cache.json" || fail "bench cache --ssd json lacks $key (a staged load's rate)"
done
[ -z "$(ls -A "$TMP/cssd")" ] || fail "bench cache --ssd left files: $(ls -A "$TMP/cssd")"
"$KVT" stress --buffer-bytes 2M --seconds 0.2 --interval 0.1 >"$TMP/st.txt" || fail "stress"
grep -q "thread 0" "$TMP/st.txt" || fail "stress text lacks per-thread rates"
"$KVT" stress --help | grep -q -- "--buffer-bytes" || fail "stress --help"
"$KVT" bench xfer --help | grep -q -- "--page-tokens" || fail "bench xfer --help"
"$KVT" bench --help | grep -q "xfer" || fail "bench --help lacks xfer"
"$KVT" --help | grep -q "stress" || fail "kvtier --help lacks stress"

# bad input
expect 2 "--page-tokens: '0'" -- bench xfer --page-tokens 0
expect 2 "unknown method 'warp'" -- bench xfer --methods cpu,warp
expect 2 "--order: 'sideways'" -- bench xfer --order sideways
expect 2 "--tp-rank 3 is not below --tp 2" -- bench xfer --tp 2 --tp-rank 3
expect 2 "--nt: 'maybe'" -- bench xfer --nt maybe
expect 2 "unexpected argument 'extra'" -- bench xfer extra
expect 2 "nosuch" -- bench xfer --model nosuch
expect 1 "bench xfer" -- bench xfer --tokens 16 --page-tokens 16 --repeat 1 --methods uring --ssd /proc/nope
expect 2 "--direct needs --ssd" -- bench cache --direct
expect 2 "--direct needs --ssd" -- bench cache --direct --gpu --ssd /tmp
expect 2 "--threads: '0'" -- stress --threads 0
expect 2 "--buffer-bytes: '1K'" -- stress --buffer-bytes 1K
expect 2 "--seconds: '0'" -- stress --seconds 0
expect 1 "available" -- stress --threads 2 --buffer-bytes 10T --seconds 1
expect 2 "unexpected argument 'now'" -- stress now

[ $fails = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "bench xfer and stress: ok"
