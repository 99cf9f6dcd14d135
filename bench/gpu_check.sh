#!/usr/bin/env bash
# The GPU check: one command on a machine with one CUDA GPU, torch already installed, no network.
#   bash bench/gpu_check.sh OUT_DIR
# Installs the checkout, benchmarks CIFAR-10 (n=100,000 extrapolated, m=5) and ImageNet (n=10,000)
# with the engine's default CUDA path side by side with the reference-equivalent baseline in the
# same process, measures the vote agreement of fp16/bf16/compiled with eager fp32 on the demo
# models, runs the GPU-marked tests, and prints one table (also OUT_DIR/summary.md). Every step
# has its own time limit and writes as it goes, so a slow step never loses the others' results.
set -uo pipefail
OUT=${1:?usage: bash bench/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

step install
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v -i warning | tail -2
$PY - <<'EOF' >&2
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0))
EOF
if $PY -c "import tensorrt" 2>/dev/null; then step "tensorrt importable"; else step "tensorrt not installed: TensorRT path not checked"; fi

step "CIFAR-10: engine (compiled fp16, CUDA graphs, 2 streams) vs reference-equivalent"
timeout ${CIFAR_LIMIT:-240} $PY -m diffsmooth.cli bench --models cifar10 --device cuda --precision fp16 \
    --n 100000 --m 5 --measure-n ${CIFAR_MEASURE_N:-10000} --quiet --results "$OUT/bench.jsonl" \
    > "$OUT/bench_cifar10.txt" 2>&1; echo "exit $?" >> "$OUT/bench_cifar10.txt"
tail -n 30 "$OUT/bench_cifar10.txt" >&2

step "ImageNet: engine vs reference-equivalent"
timeout ${IMAGENET_LIMIT:-200} $PY -m diffsmooth.cli bench --models imagenet --device cuda --precision fp16 \
    --n 10000 --m 5 --measure-n ${IMAGENET_MEASURE_N:-640} --quiet --results "$OUT/bench.jsonl" \
    > "$OUT/bench_imagenet.txt" 2>&1; echo "exit $?" >> "$OUT/bench_imagenet.txt"
tail -n 30 "$OUT/bench_imagenet.txt" >&2

step "vote agreement with eager fp32 (demo models)"
timeout ${AGREEMENT_LIMIT:-150} $PY -m diffsmooth.bench.agreement --device cuda --images 20 --samples 2000 \
    --out "$OUT/agreement.json" >&2

step "GPU-marked tests"
timeout ${TESTS_LIMIT:-120} $PY -m pytest -q -p no:cacheprovider -m gpu tests/ > "$OUT/gpu_tests.log" 2>&1
tail -n 15 "$OUT/gpu_tests.log" >&2

step summary
$PY -m diffsmooth.bench.gpu_summary "$OUT" | tee "$OUT/summary.md"
