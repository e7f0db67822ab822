#!/usr/bin/env bash
# test_remote_bench — kvtier bench remote from the command line: a small
# run against its own redis-server must print the documented JSON keys
# (figures are not checked: they depend on the machine), and bad input
# must fail with one message naming the bad part. Skipped without
# redis-server / redis-benchmark. About 5 s.
. "$(dirname "$0")/cli_lib.sh" remote-bench "$@"
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
	{ echo "skip: redis-server / redis-benchmark not installed"; exit 77; }

# 4 pages of 2 tokens of llama-3.1-8b: 256 KiB each
timeout 120 "$KVT" bench remote --pages 4 --page-tokens 2 --repeats 2 --json \
	>"$TMP/r.json" || fail "bench remote --json"
for key in '"bench":	"remote"' '"pages":	4' '"page_bytes":	262144' \
	   '"get_gbps":' '"redis_benchmark_gbps":' '"ratio":' \
	   '"redis_benchmark_p1_gbps":' '"ratio_vs_p1":' '"set_gbps":' \
	   '"hits":	12' '"bad_values":	0' '"read_failures":	0' '"runs":'; do
	grep -qF "$key" "$TMP/r.json" || fail "bench remote --json lacks $key"
done
ls -d /tmp/kvtier-bench-remote.* 2>/dev/null | grep -q . &&
	fail "bench remote left its temporary directory"
timeout 120 "$KVT" bench remote --pages 2 --page-tokens 1 --repeats 1 \
	>"$TMP/r.txt" || fail "bench remote (text)"
grep -q "^  ratio" "$TMP/r.txt" || fail "bench remote text lacks the ratio"

expect 2 "expected redis://HOST:PORT" -- bench remote --url http://x
expect 2 "unknown option" -- bench remote --url redis://127.0.0.1:1,bogus=1
expect 2 "auth=***" -- bench remote --url redis://127.0.0.1:1,auth=pw,x=1
expect 2 "--pages" -- bench remote --pages 0
expect 2 "unexpected argument" -- bench remote extra
expect 1 "took 0 of 2 pages" -- bench remote --url redis://127.0.0.1:1,timeout=100 --pages 2 --page-tokens 1
exit $((fails > 0))
