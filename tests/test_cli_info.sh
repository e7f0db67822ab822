#!/usr/bin/env bash
# test_cli_info — kvtier info and the command line's answers to bad input:
# each gets one clear message naming the bad part and a non-zero exit, and
# leaves no half-made files.
. "$(dirname "$0")/cli_lib.sh" info "$@"

# good runs
"$KVT" info >"$TMP/info.txt" || { echo "FAIL: kvtier info"; fails=$((fails+1)); }
grep -q "io_uring" "$TMP/info.txt" || { echo "FAIL: info lacks io_uring"; fails=$((fails+1)); }
"$KVT" info --json --tiers "dram:64M,fabric:file=$TMP/fab,64M,ssd:$TMP/ssd,128M,hostdev:64M" \
	>"$TMP/info.json" || { echo "FAIL: kvtier info --json --tiers"; fails=$((fails+1)); }
for key in '"machine"' '"numa_nodes"' '"hugepages"' '"io_uring"' '"cuda"' \
	   '"tiers"' '"slots":' '"emulated":	true' '"kind":	"ssd"' '"kind":	"hostdev"'; do
	grep -qF "$key" "$TMP/info.json" || { echo "FAIL: info --json lacks $key"; fails=$((fails+1)); }
done
[ -f "$TMP/ssd/kvtier-ssd-000.kvt" ] || { echo "FAIL: ssd file not built"; fails=$((fails+1)); }
KVT_TIERS="dram:32M" "$KVT" info | grep -q "^  dram" || { echo "FAIL: KVT_TIERS ignored"; fails=$((fails+1)); }
"$KVT" info --help | grep -q -- "--tiers" || { echo "FAIL: info --help"; fails=$((fails+1)); }
"$KVT" --help | grep -q "info" || { echo "FAIL: kvtier --help"; fails=$((fails+1)); }
"$KVT" version | grep -q "kvtier 0" || { echo "FAIL: version"; fails=$((fails+1)); }

# bad input
expect 2 "unknown command 'frob'" -- frob
expect 2 "8Q" -- info --tiers dram:8Q
expect 2 "does not start with a tier" -- info --tiers disk:1G
expect 2 "unknown option 'bogus'" -- info --tiers dram:1G,bogus
expect 2 "unknown model 'gpt-17'" -- info --model gpt-17
expect 2 "not an integer" -- info --page-tokens abc
expect 2 "8 KV heads cannot be split" -- info --tp 3
expect 2 "holds no page" -- info --tiers dram:1K
expect 2 "more than this machine" -- info --tiers dram:100T
expect 2 "must be a devdax device" -- info --tiers fabric:/dev/null
expect 2 "unexpected argument" -- info extra
expect 1 "No such file" -- info --tiers fabric:/dev/dax7.7
KVT_TP=two "$KVT" info >/dev/null 2>"$TMP/env.err"; rc=$?
{ [ $rc = 2 ] && grep -q "KVT_TP" "$TMP/env.err"; } || { echo "FAIL: bad KVT_TP"; fails=$((fails+1)); }
echo '{"num_hidden_layers": 2, "hidden_size": 64' >"$TMP/bad.json"
expect 2 "not valid JSON" -- info --model "$TMP/bad.json"
echo '{"hidden_size": 64, "num_attention_heads": 4}' >"$TMP/config.json"
expect 2 "num_hidden_layers" -- info --model "$TMP"
# a full disk: nothing is left behind
expect 1 "only" -- info --tiers "ssd:$TMP/huge,100T"
[ ! -e "$TMP/huge" ] || { echo "FAIL: half-made ssd directory left"; fails=$((fails+1)); }
expect 1 "only" -- info --tiers "fabric:file=$TMP/hugefab,100T"
[ ! -e "$TMP/hugefab" ] || { echo "FAIL: half-made fabric file left"; fails=$((fails+1)); }

# options from a config file sit below the environment and the flags
printf 'tiers = dram:48M\npage_tokens = 32\n' >"$TMP/kvt.conf"
"$KVT" info --config "$TMP/kvt.conf" | grep -q "32 tokens/page" || { echo "FAIL: --config"; fails=$((fails+1)); }
KVT_PAGE_TOKENS=64 "$KVT" info --config "$TMP/kvt.conf" | grep -q "64 tokens/page" || { echo "FAIL: env over file"; fails=$((fails+1)); }
KVT_PAGE_TOKENS=64 "$KVT" info --config "$TMP/kvt.conf" --page-tokens 8 | grep -q "8 tokens/page" || { echo "FAIL: flag over env"; fails=$((fails+1)); }
printf 'page_tokens = many\n' >"$TMP/bad.conf"
expect 2 "bad.conf:1" -- info --config "$TMP/bad.conf"

# a character device that is not devdax (needs a writable /dev: root)
if [ -w /dev ] && ln -s /dev/null /dev/dax-kvt-test$$ 2>/dev/null; then
	expect 2 "is not a devdax device" -- info --tiers fabric:/dev/dax-kvt-test$$
	rm -f /dev/dax-kvt-test$$
fi

[ "$fails" = 0 ] && echo "all cli checks passed"
exit $((fails > 0))
