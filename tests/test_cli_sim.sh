#!/usr/bin/env bash
# test_cli_sim — kvtier sim: the JSON keys the issue names, CSV, the plot,
# and one clear message (naming the bad part) with exit 2 for bad input.
. "$(dirname "$0")/cli_lib.sh" sim "$@"

small="--sessions 3 --turns 3 --context 8192 --append 512 --output 16"

# the agentic shape of the issue, small
"$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 --workload agentic \
	$small --offload fabric --stress 4 --policy lmcache --json >"$TMP/a.json" ||
	fail "sim agentic --json"
for key in '"warm_ttft_ms":' '"ttft_ms":' '"mean":' '"p50":' '"p90":' '"p99":' \
	   '"throughput_tok_s":' '"gpu_busy":' '"links":' '"config":' \
	   '"policy":	"lmcache"' '"offload":	["fabric"]'; do
	grep -qF "$key" "$TMP/a.json" || fail "sim --json lacks $key"
done

# all policies: one object each
"$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 $small --policy all \
	--json >"$TMP/all.json" || fail "sim --policy all"
[ "$(grep -c '"policy":	"' "$TMP/all.json")" -ge 3 ] || fail "--policy all lacks policies"

# the sweep shape of the issue, small
"$KVT" sim --hardware testbed-b --model llama-3.1-8b --workload loogle \
	--requests 150 --cache-distance 8 --context 4000 --policy kvtier \
	--sweep --rates 0.5,2,8 --ttft-target 400 --json >"$TMP/s.json" ||
	fail "sim --sweep --json"
for key in '"curve":' '"rate":' '"throughput_tok_s":' '"ttft_ms":' \
	   '"at_target":' '"met":'; do
	grep -qF "$key" "$TMP/s.json" || fail "sweep --json lacks $key"
done

# CSV: a header and one row per policy
n=$("$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 $small \
	--policy lmcache,kvtier --csv | wc -l)
[ "$n" = 3 ] || fail "--csv printed $n lines, want 3"

# the plot (needs gnuplot)
if command -v gnuplot >/dev/null; then
	"$KVT" sim --hardware testbed-b --model llama-3.1-8b --workload loogle \
		--requests 150 --cache-distance 8 --context 4000 --policy all \
		--sweep --rates 0.5,4 --ttft-target 400 --plot "$TMP/p.png" \
		>/dev/null || fail "sim --plot"
	[ -s "$TMP/p.png" ] || fail "--plot wrote no PNG"
	head -c 8 "$TMP/p.png" | grep -q PNG || fail "--plot output is not a PNG"
fi

# throughput at equal TTFT between two policies: table, ratio, plot
"$KVT" sim --hardware testbed-b --model llama-3.1-8b --workload loogle \
	--requests 150 --cache-distance 8 --context 4000 --policy lmcache,kvtier \
	--sweep --rates 0.5,2,8 --ttft-targets 300,1000 >"$TMP/r.txt" ||
	fail "sim --ttft-targets"
grep -q "throughput at equal mean TTFT" "$TMP/r.txt" || fail "no equal-TTFT table"
grep -qE "^ +300 " "$TMP/r.txt" || fail "equal-TTFT table lacks the 300 ms row"
if command -v gnuplot >/dev/null; then
	"$KVT" sim --hardware testbed-b --model llama-3.1-8b --workload loogle \
		--requests 150 --cache-distance 8 --context 4000 \
		--policy lmcache,kvtier --sweep --rates 0.5,2,8 \
		--ratio-plot "$TMP/r.png" >/dev/null || fail "sim --ratio-plot"
	head -c 8 "$TMP/r.png" | grep -q PNG || fail "--ratio-plot wrote no PNG"
fi

# --set changes the profile; --explain ranks the inputs, assumptions named
a=$("$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 $small --csv | tail -1)
b=$("$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 $small --csv \
	--set link.gpus_per_uplink=0 | tail -1)
[ "$a" != "$b" ] || fail "--set link.gpus_per_uplink=0 changed nothing"
"$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 --sessions 2 \
	--turns 2 --context 4096 --append 256 --output 8 --explain >"$TMP/e.txt" ||
	fail "sim --explain"
grep -q "assumptions that moved the result most" "$TMP/e.txt" || fail "--explain summary"
grep -q "ASSUMED" "$TMP/e.txt" || fail "--explain names no assumption"
grep -q "link.gpus_per_uplink" "$TMP/e.txt" || fail "--explain lacks the uplink"
# the two named HiCache presets and vLLM's connector run
for p in hicache hicache-kernel vllm; do
	"$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 $small \
		--policy $p --json | grep -qF "\"policy\":	\"$p\"" ||
		fail "sim --policy $p"
done
"$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 $small \
	--policy hicache-kernel --json | grep -qF '"page_tokens":	64' ||
	fail "hicache-kernel does not use 64-token pages"

# help and the text table
"$KVT" sim --help | grep -qF -- "--ttft-target" || fail "sim --help"
"$KVT" sim --hardware testbed-a --model qwen2.5-32b --tp 4 $small |
	grep -q "warm" || fail "sim text output lacks the warm line"

# bad input
expect 2 "unknown hardware profile 'moon'" -- sim --hardware moon
expect 2 "--policy: 'fast' is not" -- sim --policy fast
expect 2 "unknown workload 'chat'" -- sim --workload chat
expect 2 "--offload: 'nvram' is not" -- sim --offload nvram
expect 2 "offload tier 'fabric'" -- sim --hardware testbed-b --offload fabric
expect 2 "at TP 8 need 8 GPUs" -- sim --hardware testbed-a --tp 8 --model llama-3.1-70b
expect 2 "unknown model 'gpt-17'" -- sim --model gpt-17
expect 2 "--tp: 'x' is not an integer" -- sim --tp x
expect 2 "--plot draws sweep curves" -- sim --plot x.png
expect 2 "--ttft-target needs --sweep" -- sim --ttft-target 100
expect 2 "open-loop workload" -- sim --sweep
expect 2 "unknown scheduler feature 'magic'" -- sim --features -magic
expect 2 "does not fit" -- sim --hardware testbed-b --model llama-3.1-70b
expect 2 "unexpected argument 'extra'" -- sim extra
expect 1 "trace" -- sim --workload trace:/nonexistent/t.jsonl
expect 1 "--xfer /nonexistent/x.json" -- sim --xfer /nonexistent/x.json
expect 2 "unknown profile key 'gpu.warp'" -- sim --set gpu.warp=9
expect 2 "--set: KEY=VALUE" -- sim --set gpu.flops
expect 2 "gpu.gemm_eff (override): 7 is outside" -- sim --set gpu.gemm_eff=7
expect 2 "--cpu-latency: on or off" -- sim --cpu-latency maybe
expect 2 "--explain explains one run" -- sim --explain --policy all
expect 2 "--ratio-plot needs --sweep" -- sim --ratio-plot x.png
expect 2 "--ttft-targets: 'x' is not" -- sim --ttft-targets x

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "ok"
