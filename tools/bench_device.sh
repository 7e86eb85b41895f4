#!/usr/bin/env bash
# The accelerator benchmarks as one prepared run that fits in 10 minutes on one GPU or TPU host:
#
#     bash tools/bench_device.sh                # on the machine with the accelerator, from the repository root
#     OUT_DIR=/some/folder bash tools/bench_device.sh
#
# It writes every figure as a JSON line to $OUT_DIR/device-<device kind>.jsonl (default folder: $OUT where the
# device tool provides it, else bench_results/), and each tool's log beside it; BENCHMARKS.md ("Accelerators") reads
# its figures from there. Each part has its own time limit, and a part that fails or runs out of time is recorded
# as a {"name": "part_failed"} line while the others go on; the exit status is non-zero when any part failed.
#
# Python: $PYTHON, else .venv/bin/python, else python3; it must have templm's dependencies and a jax that sees the
# accelerator (jax[cuda12] or jax[tpu]). On a machine without one it stops at once, unless BENCH_DEVICE_ALLOW_CPU=1
# (a dry run of the script itself, with the tiny configs only).
set -uo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR=${OUT_DIR:-${OUT:-bench_results}}
mkdir -p "$OUT_DIR"
export TF_CPP_MIN_LOG_LEVEL=3 GLIBC_TUNABLES=glibc.malloc.hugetlb=1

read -r BACKEND KIND COUNT < <("$PY" -c '
import jax
d = jax.devices()
print(jax.default_backend(), d[0].device_kind.replace(" ", "_").replace("/", "_"), len(d))' 2>/dev/null)
if [ -z "${BACKEND:-}" ]; then
    echo "bench_device: $PY cannot import jax (set PYTHON to an interpreter with templm's dependencies)" >&2
    exit 2
fi
QUICK=0
if [ "$BACKEND" = "cpu" ]; then
    if [ "${BENCH_DEVICE_ALLOW_CPU:-0}" != "1" ]; then
        echo "bench_device: jax sees no accelerator (backend cpu); BENCH_DEVICE_ALLOW_CPU=1 for a dry run" >&2
        exit 2
    fi
    QUICK=1
fi
FIGURES="$OUT_DIR/device-$KIND.jsonl"
echo "bench_device: $COUNT x $KIND ($BACKEND), figures in $FIGURES" >&2
FAILED=0

part() {  # part NAME SECONDS COMMAND...: runs one tool, its JSON lines appended to $FIGURES, its log beside them
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    echo "bench_device: $name (at most ${limit} s) ..." >&2
    timeout --kill-after=10 "$limit" "$@" 2>"$OUT_DIR/$name.log" | grep '^{' >>"$FIGURES"
    local status=${PIPESTATUS[0]}
    echo "bench_device: $name: exit $status after $((SECONDS - start)) s" >&2
    if [ "$status" != 0 ]; then
        FAILED=1
        printf '{"name": "part_failed", "part": "%s", "exit": %s, "seconds": %s, "device": "%s"}\n' \
            "$name" "$status" "$((SECONDS - start))" "$KIND" >>"$FIGURES"
    fi
}

if [ "$QUICK" = 1 ]; then
    part t5 120 "$PY" tools/bench_t5.py --quick
    part txl 90 "$PY" tools/bench_txl.py --quick
    part checkpoint 150 "$PY" tools/bench_checkpoint.py --part save --config tiny --saves 2 --window 6
else
    # T5 v1.1 train steps (tokens/s, MFU against the device's published peak, compile time), bfloat16 and float32.
    part t5_bf16 210 "$PY" tools/bench_t5.py --configs tiny,small,base --dtype bfloat16 --batch 32 \
        --input_len 512 --target_len 128 --no_peer --no_sharded --rounds 3
    part t5_f32 100 "$PY" tools/bench_t5.py --configs small --batch 32 --input_len 512 --target_len 128 \
        --no_peer --no_sharded --rounds 2
    # Transformer-XL streaming evaluation, static and dynamic.
    part txl 100 "$PY" tools/bench_txl.py --configs tiny,mid --dtype bfloat16 --rounds 2
    # Checkpoint save stall, asynchronous vs synchronous, T5 small.
    part checkpoint 130 "$PY" tools/bench_checkpoint.py --part save --config small --saves 2
fi
echo "bench_device: done in $SECONDS s; $(grep -c '^{' "$FIGURES") lines in $FIGURES" >&2
exit $FAILED
