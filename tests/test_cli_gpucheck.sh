#!/usr/bin/env bash
# test_cli_gpucheck — scripts/gpu-check's own behaviour without a GPU, on
# this build tree as a prebuilt one (no build): its prerequisite report
# (prereqs.json, embedded in summary.json) names what is found and missing,
# a prebuilt tree that lacks a binary stops the run with exit 1 naming it,
# and the dry run (one device test, its CPU half) exits 77 with a valid
# report. On a machine with a GPU the dry run is not one: skipped (77).
. "$(dirname "$0")/cli_lib.sh" gpucheck "$@"
SRC=${KVT_SOURCE_DIR:?}
B=$(cd "$(dirname "$KVT")" && pwd)
if nvidia-smi -L >/dev/null 2>&1; then
	echo "skip: a GPU is here: gpu-check's dry run is not one"
	exit 77
fi
export GPU_CHECK_PYTHON=none
"$SRC/scripts/gpu-check" --help | grep -q -- "--prebuilt" || fail "--help lacks --prebuilt"
"$SRC/scripts/gpu-check" --bogus >/dev/null 2>&1; [ $? = 2 ] || fail "an unknown argument is not exit 2"

# the dry run over this build tree: exit 77, the report says why
OUT="$TMP/dry" GPU_CHECK_ONLY=test_dev_xxh3 "$SRC/scripts/gpu-check" --prebuilt "$B" \
	>"$TMP/dry.log" 2>&1
rc=$?
[ $rc = 77 ] || fail "dry run: exit $rc (want 77): $(tail -5 "$TMP/dry.log")"
python3 - "$TMP/dry" <<'PY' || fail "dry run: summary.json: $(cat "$TMP/dry/summary.json" 2>&1 | head -c 400)"
import json, sys
r = json.load(open(sys.argv[1] + "/summary.json"))
st = {s["name"]: s for s in r["steps"]}
assert r["complete"], r
assert st["prereqs"]["status"] == "pass", st["prereqs"]
p = st["prereqs"]["result"]
assert p["mode"] == "prebuilt" and p["missing"] == [], p
assert any(o.startswith("a GPU:") for o in p["optional"]), p
assert st["build"]["status"] == "pass" and "prebuilt" in st["build"]["note"]
assert st["test_dev_xxh3"]["status"] == "pass", st["test_dev_xxh3"]
assert set(st) == {"prereqs", "build", "info", "test_dev_xxh3"}, list(st)
PY

# a prebuilt tree without its tests: stops at once, naming each
mkdir -p "$TMP/half"
cp "$B/kvtier" "$TMP/half/" && cp -P "$B"/libkvtier.so* "$TMP/half/"
OUT="$TMP/half-out" "$SRC/scripts/gpu-check" --prebuilt "$TMP/half" >"$TMP/half.log" 2>&1
rc=$?
[ $rc = 1 ] || fail "half a prebuilt tree: exit $rc (want 1)"
grep -q '"missing":\[".*tests/test_dev_threads: the prebuilt tree lacks it' "$TMP/half-out/prereqs.json" ||
	fail "prereqs.json does not name the missing test: $(cat "$TMP/half-out/prereqs.json")"
grep -q "missing: .*tests/test_server_dev_threads" "$TMP/half.log" || fail "the log does not say what is missing"
[ ! -e "$TMP/half-out/test_dev_xxh3.log" ] || fail "ran a step with prerequisites missing"
# no such directory
OUT="$TMP/none-out" "$SRC/scripts/gpu-check" --prebuilt "$TMP/nothere" >/dev/null 2>&1
[ $? = 1 ] && grep -q "names no directory" "$TMP/none-out/prereqs.json" || fail "--prebuilt of nothing"

# a bundle on a GPU machine without nvcc (what the device tool lends): the
# prebuilt library decides whether it is a CUDA build, and the driver must
# support its runtime's major version. A fake nvidia-smi plays the machine.
cudart=$(ldd "$B/libkvtier.so" 2>/dev/null | awk '$1 ~ /^libcudart\.so/ {print $1; exit}')
mkdir -p "$TMP/fake"
fake_smi() { # CUDA version the fake driver reports
	cat >"$TMP/fake/nvidia-smi" <<SH
#!/bin/sh
case "\$1" in
-L) echo "GPU 0: Fake GPU (UUID: GPU-0)" ;;
--query-gpu=*) echo "999.99" ;;
*) echo "| NVIDIA-SMI 999.99   Driver Version: 999.99   CUDA Version: $1     |" ;;
esac
SH
	chmod +x "$TMP/fake/nvidia-smi"
}
if [ -n "$cudart" ]; then
	rt=${cudart#libcudart.so.}
	fake_smi "$((rt - 1)).9"
	PATH="$TMP/fake:$PATH" OUT="$TMP/olddrv" GPU_CHECK_ONLY=none \
		"$SRC/scripts/gpu-check" --prebuilt "$B" >"$TMP/olddrv.log" 2>&1
	rc=$?
	[ $rc = 1 ] || fail "a driver older than the bundle's runtime: exit $rc (want 1)"
	grep -q "a driver for CUDA $rt: this driver supports CUDA $((rt - 1)).9" "$TMP/olddrv/prereqs.json" ||
		fail "prereqs.json does not name the driver: $(cat "$TMP/olddrv/prereqs.json")"
	fake_smi "$rt.0"
	PATH="$TMP/fake:$PATH" OUT="$TMP/newdrv" GPU_CHECK_ONLY=none \
		"$SRC/scripts/gpu-check" --prebuilt "$B" >"$TMP/newdrv.log" 2>&1
	python3 - "$TMP/newdrv" <<'PY' || fail "a driver new enough: $(head -c 600 "$TMP/newdrv/prereqs.json")"
import json, sys
p = json.load(open(sys.argv[1] + "/prereqs.json"))
assert p["missing"] == [], p
# a CUDA build found without nvcc on the path: no "a GPU:" line
assert not any(o.startswith("a GPU:") for o in p["optional"]), p
PY
else
	fake_smi "13.0"
	PATH="$TMP/fake:$PATH" OUT="$TMP/nocuda" GPU_CHECK_ONLY=none \
		"$SRC/scripts/gpu-check" --prebuilt "$B" >"$TMP/nocuda.log" 2>&1
	grep -q "not a CUDA build" "$TMP/nocuda/prereqs.json" ||
		fail "a prebuilt tree without CUDA is not named: $(cat "$TMP/nocuda/prereqs.json")"
fi
exit $((fails > 0))
