#!/usr/bin/env bash
# test_cli_bench_dev — kvtier bench server --device emu [--baselines]: the
# issue-20 benchmark's whole path on the emulated device, small (it is
# measured for real with its defaults; here only that it runs and says
# what it must): the JSON keys, the daemon's zero CPU copy count, the
# baselines' comparisons, and refusals of bad input.
. "$(dirname "$0")/cli_lib.sh" bench-dev "$@"

"$KVT" bench server --device emu --baselines --pages 8 --page-tokens 4 \
	--repeats 2 --json >"$TMP/b.json" || fail "bench server --device emu"
for key in '"device":	"emu:0"' '"emulated":	true' '"cpu_copy_bytes":	0' \
	   '"device_copy_bytes":' '"cpu_hashed_bytes":	0' '"daemon_vs_inproc":' \
	   '"baselines":' '"contig_gbps":' '"batch_gbps":' '"chunk_gbps":' \
	   '"kernel_verify_gbps":' '"store_gbps":' '"vs_contig":' '"vs_batch":' \
	   '"vs_chunk":' '"verify_cost":' '"stores_vs_contig":' '"note":'; do
	grep -qF "$key" "$TMP/b.json" || fail "bench server --json lacks $key"
done
grep -qF '"device_copy_bytes":	0,' "$TMP/b.json" &&
	fail "the device moved nothing"
"$KVT" bench server --device emu --pages 4 --page-tokens 4 --repeats 1 \
	>"$TMP/b.txt" || fail "bench server --device emu (text)"
grep -q "0 bytes copied by a CPU" "$TMP/b.txt" || fail "text lacks the CPU copy count"

expect 2 "--baselines needs --device" -- bench server --baselines
expect 2 "device 'gpu7'" -- bench server --device gpu7
exit $((fails > 0))
