#!/usr/bin/env bash
# test_cli_badinput — malformed command lines and files, every subcommand:
# each must end with its expected exit status (2: bad usage or input the
# user must fix; 1: a file that cannot be read) and an error line that
# starts as the table says; none may crash, hang or exit 0. Each row is
#   row EXIT 'START OF THE FIRST stderr LINE' ARGS...
# (issue 10: the table of a careless operator's inputs).
. "$(dirname "$0")/cli_lib.sh" badinput "$@"

: >"$TMP/empty"
# bytes no text holds (no newline, "=", "#" or printable first byte)
LC_ALL=C awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%c", 128 + (i * 37) % 128 }' >"$TMP/binary"
printf 'hello\0world\n' >"$TMP/nul"
mkdir -p "$TMP/dir"
printf '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1]} x\n' >"$TMP/trailing.jsonl"
printf 'name = t\ngpus = nan\n' >"$TMP/nan.prof"
printf '{"num_hidden_layers": 2, "num_attention_heads": 1, "hidden_size": 4294967295, "vocab_size": 4294967295}' >"$TMP/huge.json"
printf '{"results": [{"method": "cuda-kernel", "direction": "load", "page_tokens": 1e10, "gbps": 40}]}' >"$TMP/huge-xfer.json"
printf '{"results": [{"method": "cuda-kernel", "direction": "load", "page_tokens": 16, "gbps": 1e-300}]}' >"$TMP/tiny-xfer.json"
printf 'page_tokens = -3\n' >"$TMP/neg.conf"
N=$TMP/none

row() {
	local want=$1 start=$2; shift 2
	local out rc first
	out=$(timeout 60 "$KVT" "$@" 2>&1 >/dev/null); rc=$?
	first=$(head -1 <<<"$out")
	if [ "$rc" != "$want" ] || [ "${first#"$start"}" = "$first" ]; then
		fail "kvtier $* -> exit $rc (want $want), first line: '$first' (want '$start...')"
	fi
}

# the command itself
row 2 "kvtier: unknown command 'nosuch'"              nosuch
row 2 "kvtier version: unexpected argument 'extra'"   version extra
row 2 "kvtier version: unexpected argument '--json'"  version --json

# info
row 2 "info: unrecognized option '--nosuch'"          info --nosuch
row 2 "kvtier info: unexpected argument 'extra'"      info extra
row 2 "kvtier info: --tiers: empty tier spec"         info --tiers ''
row 2 "kvtier info: empty tier spec"                  info --tiers ','
row 2 "kvtier info: tier spec 'dram:-1G': unknown option '-1G'" info --tiers 'dram:-1G'
row 2 "kvtier info: tier spec 'dram:nanG'"            info --tiers 'dram:nanG'
row 2 "kvtier info: tier spec 'dram:99999999999999999999G': bad size" info --tiers 'dram:99999999999999999999G'
row 2 "kvtier info: tier spec 'dram:1G,numa=-1': bad NUMA node" info --tiers 'dram:1G,numa=-1'
row 2 "kvtier info: tier spec 'dram:1G,numa=nan': bad NUMA node" info --tiers 'dram:1G,numa=nan'
row 2 "kvtier: --page-tokens: '0' is not an integer in 1..1048576" info --page-tokens 0
row 2 "kvtier: --page-tokens: '-1' is not an integer"   info --page-tokens -1
row 2 "kvtier info: option page_tokens: '99999999999999999999999' is not an integer" info --page-tokens 99999999999999999999999
row 2 "kvtier info: option page_tokens: 'nan' is not an integer" info --page-tokens nan
row 2 "kvtier info: model llama-3.1-8b: TP rank 5 not below TP size 3" info --tp 3 --tp-rank 5
row 2 "kvtier info: unknown model '$N.json'"          info --model "$N.json"
row 2 "kvtier info: empty: not valid JSON near ''"            info --model "$TMP/empty"
row 2 "kvtier info: binary: not valid JSON near '?"           info --model "$TMP/binary"
row 2 "kvtier info: config huge.json: \"hidden_size\" is not an integer in 0..16777216" info --model "$TMP/huge.json"
row 1 "kvtier info: config /dev/zero: a device, not a file" info --model /dev/zero
row 1 "kvtier info: config $TMP/dir/config.json: No such file" info --model "$TMP/dir"
row 1 "kvtier info: config file $N.conf: No such file" info --config "$N.conf"
row 2 "kvtier info: $TMP/binary:1: expected 'name = value'" info --config "$TMP/binary"
row 1 "kvtier info: config file /dev/zero: a device, not a file" info --config /dev/zero
row 2 "kvtier: --page-tokens: '-3' is not an integer" info --config "$TMP/neg.conf"

# sim
row 2 "sim: unrecognized option '--nosuch'"           sim --nosuch
row 2 "kvtier sim: unexpected argument 'extra'"       sim extra
row 2 "kvtier sim: profile '$N.prof': No such file"   sim --hardware "$N.prof"
row 2 "kvtier sim: $TMP/empty: missing key 'name'"    sim --hardware "$TMP/empty"
row 2 "kvtier sim: $TMP/binary:1: line too long" sim --hardware "$TMP/binary"
row 2 "kvtier sim: $TMP/nan.prof:2: gpus: nan is outside 1..1024" sim --hardware "$TMP/nan.prof"
row 2 "kvtier sim: profile '/dev/zero': a device, not a file" sim --hardware /dev/zero
row 2 "kvtier sim: profile '$TMP/dir': Is a directory" sim --hardware "$TMP/dir"
row 1 "kvtier sim: --xfer $N.json: No such file"      sim --xfer "$N.json"
row 2 "kvtier sim: $TMP/empty: not JSON"              sim --xfer "$TMP/empty"
row 2 "kvtier sim: $TMP/binary: not JSON"             sim --xfer "$TMP/binary"
row 1 "kvtier sim: --xfer /dev/zero: a device, not a file" sim --xfer /dev/zero
row 2 "kvtier sim: $TMP/huge-xfer.json: cuda-kernel load point 1: page_tokens must be" sim --xfer "$TMP/huge-xfer.json"
row 2 "kvtier sim: $TMP/tiny-xfer.json: cuda-kernel load point 1" sim --xfer "$TMP/tiny-xfer.json"
row 1 "kvtier sim: trace $N.jsonl: No such file"      sim --workload "trace:$N.jsonl"
row 2 "kvtier sim: $TMP/empty: no request in the trace" sim --workload "trace:$TMP/empty"
row 2 "kvtier sim: $TMP/binary:1: not JSON"           sim --workload "trace:$TMP/binary"
row 2 "kvtier sim: $TMP/trailing.jsonl:1: data after the JSON object" sim --workload "trace:$TMP/trailing.jsonl"
row 1 "kvtier sim: trace /dev/zero: a device, not a file" sim --workload trace:/dev/zero
row 2 "kvtier sim: $TMP/binary: not valid JSON"       sim --model "$TMP/binary"
row 2 "kvtier: --output: '-1' is not an integer"      sim --output -1
row 2 "kvtier: --output: 'nan' is not an integer"     sim --output nan
row 2 "kvtier: --output: '99999999999999999999' is not an integer" sim --output 99999999999999999999
row 2 "kvtier: --rate: 'nan' is not a number"     sim --rate nan
row 2 "kvtier: --rate: 'inf' is not a number"     sim --rate inf
row 2 "kvtier: --rate: '-1' is not a number"      sim --rate -1
row 2 "kvtier: --think: 'nan' is not a number"    sim --think nan
row 2 "kvtier: --balance-ratio: 'nan' is not a number" sim --balance-ratio nan
row 2 "kvtier: --rates: 'nan' is not a number"    sim --rates nan --sweep --workload loogle
row 2 "kvtier: --seed: '-5' is not an integer"        sim --seed -5
row 2 "kvtier: --requests: '0' is not an integer"     sim --requests 0 --workload loogle
row 2 "kvtier: --stress: '999999' is not an integer"  sim --stress 999999
row 2 "kvtier: --engines: '0' is not an integer"      sim --engines 0
row 2 "kvtier: --tp: '0' is not an integer"           sim --tp 0
row 2 "kvtier sim: --offload-bytes: '-1G' is not a size" sim --offload-bytes -1G --offload dram
row 2 "kvtier sim: --policy: 'nosuch' is not"         sim --policy nosuch

# trace
row 2 "usage: kvtier trace replay"                    trace
row 2 "kvtier trace: unknown subcommand 'nosuch'"     trace nosuch
row 2 "kvtier trace replay: give exactly one trace file" trace replay
row 2 "replay: unrecognized option '--nosuch'"        trace replay "$N.jsonl" --nosuch
row 1 "kvtier trace replay: trace $N.jsonl: No such file" trace replay "$N.jsonl"
row 2 "kvtier trace replay: $TMP/empty: no request in the trace" trace replay "$TMP/empty"
row 2 "kvtier trace replay: $TMP/binary:1: not JSON"  trace replay "$TMP/binary"
row 2 "kvtier trace replay: $TMP/nul:1: not JSON"     trace replay "$TMP/nul"
row 2 "kvtier trace replay: $TMP/trailing.jsonl:1: data after the JSON object" trace replay "$TMP/trailing.jsonl"
row 1 "kvtier trace replay: trace /dev/zero: a device, not a file" trace replay /dev/zero
row 1 "kvtier trace replay: trace $TMP/dir: Is a directory" trace replay "$TMP/dir"
row 2 "kvtier: --capacity: '-1' is not an integer"    trace replay "$N.jsonl" --capacity -1
row 2 "kvtier: --capacity: 'nan' is not an integer"   trace replay "$N.jsonl" --capacity nan
row 2 "kvtier trace replay: --policy: 'mru' is not lru or lfu" trace replay "$N.jsonl" --policy mru

# bench
row 2 "usage: kvtier bench"                           bench
row 2 "kvtier bench: unknown benchmark 'nosuch'"      bench nosuch
row 2 "xfer: unrecognized option '--nosuch'"          bench xfer --nosuch
row 2 "kvtier: --tokens: '-1' is not an integer"      bench xfer --tokens -1
row 2 "kvtier: --tokens: 'nan' is not an integer"     bench xfer --tokens nan
row 2 "kvtier: --page-tokens: '0' is not an integer"  bench xfer --page-tokens 0
row 2 "kvtier: --repeat: '99999999999999999999' is not an integer" bench xfer --repeat 99999999999999999999
row 2 "kvtier bench xfer: binary: not valid JSON"     bench xfer --model "$TMP/binary"
row 2 "kvtier bench xfer: --methods: unknown method 'nosuch'" bench xfer --methods nosuch
row 2 "kvtier bench xfer: --stress-bytes: '-1' is not a size" bench xfer --stress-bytes -1
row 2 "pool: unrecognized option '--nosuch'"          bench pool --nosuch
row 2 "kvtier bench pool: unexpected argument 'extra'" bench pool extra
row 2 "index: unrecognized option '--nosuch'"         bench index --nosuch
row 2 "kvtier bench index: unexpected argument 'extra'" bench index extra
row 2 "sim: unrecognized option '--nosuch'"           bench sim --nosuch
row 2 "kvtier bench sim: unexpected argument 'extra'" bench sim extra
row 2 "kvtier: --rate: 'nan' is not a number"         bench sim --rate nan
row 2 "kvtier: --rate: '1x' is not a number"          bench sim --rate 1x
row 2 "kvtier: --rate: 'inf' is not a number"         bench sim --rate inf
row 2 "kvtier: --requests: '-1' is not an integer"    bench sim --requests -1

# stress
row 2 "stress: unrecognized option '--nosuch'"        stress --nosuch
row 2 "kvtier stress: unexpected argument 'extra'"    stress extra
row 2 "kvtier: --threads: '0' is not an integer"      stress --threads 0
row 2 "kvtier: --threads: '-1' is not an integer"     stress --threads -1
row 2 "kvtier stress: --seconds: 'nan' is not a number" stress --seconds nan
row 2 "kvtier stress: --seconds: 'inf' is not a number" stress --seconds inf
row 2 "kvtier stress: --buffer-bytes: '-1' is not a size" stress --buffer-bytes -1
row 2 "kvtier stress: --interval: 'nan' is not a number" stress --interval nan

# demo (argument parsing only: its runs are tested in test_cli_demo)
row 2 "demo: unrecognized option '--nosuch'"          demo --nosuch
row 2 "kvtier demo: unexpected argument 'extra'"      demo extra
row 2 "kvtier: --sessions: '-1' is not an integer"    demo --sessions -1
row 2 "kvtier: --sessions: 'nan' is not an integer"   demo --sessions nan
row 2 "kvtier: --page-tokens: '0' is not an integer"  demo --page-tokens 0
row 2 "kvtier demo: --ssd: bad size '-1G'"            demo --ssd -1G
row 2 "kvtier demo: --policy: 'nosuch' is not"        demo --policy nosuch

# files that are fine stay fine: an empty options file sets nothing
"$KVT" info --config "$TMP/empty" >/dev/null 2>&1 || fail "info --config (empty file) failed"
"$KVT" version >/dev/null || fail "kvtier version failed"

exit $((fails > 0))
