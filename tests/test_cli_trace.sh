#!/usr/bin/env bash
# test_cli_trace — kvtier trace replay on a generated trace: the human and
# JSON outputs, and clear errors with the right exit code for bad input
# (missing file, malformed line named by number, bad capacity or policy).
. "$(dirname "$0")/cli_lib.sh" trace "$@"

# 50 requests: conversations that grow by one block a turn
T=$TMP/t.jsonl
: >"$T"
for i in $(seq 0 49); do
	c=$((i % 5)); turn=$((i / 5)); ids="$((c * 1000))"
	for k in $(seq 1 "$turn"); do ids="$ids, $((c * 1000 + k))"; done
	echo "{\"timestamp\": $i, \"input_length\": $(( (turn + 1) * 512 )), \"output_length\": 9, \"hash_ids\": [$ids]}" >>"$T"
done

"$KVT" trace replay "$T" >"$TMP/out.txt" || fail "replay"
grep -q "50 requests, 275 blocks (50 distinct)" "$TMP/out.txt" || fail "summary: $(cat "$TMP/out.txt")"
grep -q "unbounded" "$TMP/out.txt" || fail "default capacities"
# unbounded: every block but the newest of each turn hits: 5 x (0+...+9)
"$KVT" trace replay "$T" --capacity 0,3 --policy lfu --json >"$TMP/out.json" || fail "replay --json"
for key in '"requests":	50' '"blocks":	275' '"results":' '"capacity":	0' \
	   '"hit_blocks":	225' '"hit_rate":' '"seconds":' '"policy":	"lfu"'; do
	grep -qF "$key" "$TMP/out.json" || fail "json lacks $key: $(cat "$TMP/out.json")"
done
"$KVT" trace --help | grep -q -- "--capacity" || fail "trace --help"
"$KVT" trace replay --help | grep -q -- "--policy" || fail "replay --help"

# bad input
expect 1 "No such file" -- trace replay "$TMP/none.jsonl"
sed '7s/.*/{"timestamp": 1, "input_length": 5,/' "$T" >"$TMP/bad.jsonl"
expect 2 "bad.jsonl:7: not JSON" -- trace replay "$TMP/bad.jsonl"
sed '9s/"hash_ids": \[/"hash_ids": [-4, /' "$T" >"$TMP/bad2.jsonl"
expect 2 "bad2.jsonl:9: 'hash_ids' holds -4" -- trace replay "$TMP/bad2.jsonl"
expect 2 "not an integer" -- trace replay "$T" --capacity 10,abc
expect 2 "not an integer" -- trace replay "$T" --capacity 99999999999999
expect 2 "not lru or lfu" -- trace replay "$T" --policy mru
expect 2 "exactly one trace file" -- trace replay
expect 2 "unknown subcommand 'play'" -- trace play "$T"
[ $fails = 0 ] && echo "ok" || { echo "$fails failure(s)"; exit 1; }
