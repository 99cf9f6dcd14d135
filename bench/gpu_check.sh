#!/usr/bin/env bash
# The GPU check: one command on a machine with one CUDA GPU, torch already installed, no network.
#   bash bench/gpu_check.sh OUT_DIR [speed|sequential|all]
# speed (default, ~6.5 min on an H200): installs the checkout, benchmarks CIFAR-10 (n=100,000
# extrapolated, m=5; with a kernel profile; again with --fused-conv) and ImageNet (n=10,000) with the engine's default CUDA
# path side by side with the reference-equivalent baseline in the same process, measures the vote
# agreement of fp16/bf16/compiled with eager fp32 on the demo models, runs the GPU-marked tests.
# sequential (~4 min): the 500-image fixed-n vs --sequential benchmark (issue 13's measurement);
# with ABLATION=1 also CIFAR-10 without fused attention (what that kernel is worth, ~1.5 min).
# Prints one table (also OUT_DIR/summary.md). Every step has its own time limit and writes as it
# goes, so a slow step never loses the others' results.
set -uo pipefail
OUT=${1:?usage: bash bench/gpu_check.sh OUT_DIR [speed|sequential|all]}
PART=${2:-speed}
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

if [ "$PART" = speed ] || [ "$PART" = all ]; then
step "CIFAR-10: engine (compiled fp16, CUDA graphs, 2 streams, fused attention) vs reference-equivalent"
timeout ${CIFAR_LIMIT:-240} $PY -m diffsmooth.cli bench --models cifar10 --device cuda --precision fp16 \
    --n 100000 --m 5 --measure-n ${CIFAR_MEASURE_N:-10000} --quiet --results "$OUT/bench.jsonl" \
    --profile "$OUT/profile" > "$OUT/bench_cifar10.txt" 2>&1; echo "exit $?" >> "$OUT/bench_cifar10.txt"
tail -n 32 "$OUT/bench_cifar10.txt" >&2

step "CIFAR-10 with --fused-conv (BatchNorm folded, cuDNN conv+add+ReLU): the candidate for the default"
timeout ${CIFAR_LIMIT:-240} $PY -m diffsmooth.cli bench --models cifar10 --device cuda --precision fp16 \
    --n 100000 --m 5 --measure-n ${CIFAR_MEASURE_N:-10000} --quiet --results "$OUT/bench.jsonl" --fused-conv \
    --profile "$OUT/profile-fused-conv" > "$OUT/bench_cifar10_fused_conv.txt" 2>&1
echo "exit $?" >> "$OUT/bench_cifar10_fused_conv.txt"
tail -n 34 "$OUT/bench_cifar10_fused_conv.txt" >&2

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
fi

if [ "$PART" = sequential ] || [ "$PART" = all ]; then
step "sequential vs fixed-n CERTIFY: 500 demo images x n=10,000 (compiled fp16)"
timeout ${SEQUENTIAL_LIMIT:-330} $PY -m diffsmooth.bench.sequential --device cuda --precision fp16 --quiet \
    --out "$OUT/sequential" > "$OUT/sequential.txt" 2>&1; echo "exit $?" >> "$OUT/sequential.txt"
tail -n 12 "$OUT/sequential.txt" >&2

if [ "${ABLATION:-0}" = 1 ]; then
step "CIFAR-10 without fused attention (ablation)"
timeout ${ABLATION_LIMIT:-200} $PY -m diffsmooth.cli bench --models cifar10 --device cuda --precision fp16 \
    --n 100000 --m 5 --measure-n ${CIFAR_MEASURE_N:-10000} --quiet --no-fused-attention --no-reference \
    --results "$OUT/ablation.jsonl" > "$OUT/bench_cifar10_no_fused_attention.txt" 2>&1
echo "exit $?" >> "$OUT/bench_cifar10_no_fused_attention.txt"
tail -n 20 "$OUT/bench_cifar10_no_fused_attention.txt" >&2
fi
fi

step summary
$PY -m diffsmooth.bench.gpu_summary "$OUT" | tee "$OUT/summary.md"
