#!/usr/bin/env bash
# The GPU check: one command per part on a machine with one CUDA GPU, torch already installed, no network.
#   bash bench/gpu_check.sh OUT_DIR [speed|sequential|table|ablation|fixes|headline|densepure|preflight|serve|all]
#   DRY_RUN=1 bash bench/gpu_check.sh OUT_DIR PART     # print the steps and their limits, run nothing
# Each part fits one 600 s call on a fresh H100 or H200, its own install included: the step limits of a
# part (install, import check, its steps, summary) add up to at most 540 s (tests/engine/runs/test_gpu_readiness.py
# checks this). A failed install or import stops the script at once with one line.
# speed: issue 45's variants: CIFAR-10's default CUDA path (beside the reference-equivalent baseline) and
#        each variant in one process, ImageNet's default beside batch 128, with
#        peak memory per phase; the agreement of every variant with eager fp32 (TF32 off) on the demo
#        models. The GPU-marked tests run in `fixes`.
# sequential: the demo's fixed-n vs --sequential comparison, and a reserved slot for the packed
#        sequential CIFAR-10 run.
# table: the demo table (race plan) on the CPU, on CUDA in fp32 eager (rows against the CPU's: the
#        same noise) and in fp16 compiled (the agreement check's budget), wall time and model builds
#        (bench/table_gpu.py); and one `certify --sequential --device cuda` run in fp16 with the
#        fast path's agreement check on (the two-lane continuous batching on a GPU); the cost of torchrun's
#        per-batch meeting on 8 gloo processes (bench/ranks.py --parts merge: the host's cores).
# ablation: CIFAR-10 without fused attention.
# fixes: the GPU tests that have not passed on a GPU yet, in one call (no timing runs): the Triton fused block
#        and tritonized ResNet-110 (fp16 votes, compiled and replayed in a CUDA graph), a sweep against the CPU's
#        rows, the demo pipeline in fp32/fp16/bf16, the packed ResNet-110 (--pack-images 2); then every other GPU test.
# headline: the demo table at the paper's shape (RS and DiffSmooth lines, 3 sigmas x 500 images, n-max 100,000,
#        fp16 compiled, the default race), its samples per line against the measured 2026-11-27 table
#        (docs/table-studies.md); resumable: a second call with OUT carried goes on.
# densepure: DensePure's GPU test, its flip rates measured (bench.agreement --setup densepure) and its time per
#        sample at the CIFAR-10 shapes (bench --method densepure); then torchrun's merge of an image's counts on
#        nccl (a 1-rank torchrun: bench/nccl_smoke.py, counts shared over the ranks against one rank's alone).
# preflight: `diffsmooth preflight`'s time on the demo models (rs, dds, diffsmooth) on CUDA (bench.preflight_time),
#        beside its CPU figures and its estimates for the paper's models (bench/results/preflight_cpu/).
# serve: `diffsmooth serve --demo --device cuda` on 127.0.0.1 port 0 under the load study (studies/serve_load.py) at
#        concurrency 1 and 8: PREDICT n=100 and n=1,000, sequential CERTIFY, beside the Python API offline on CUDA; the
#        server is stopped at the end. Needs the serve extra (fastapi, uvicorn; wheels in SERVE_WHEELS are installed).
# all: every part in a row (more than one call's time).
# Everything goes under OUT_DIR: one log per step, steps.tsv (step, exit status, seconds, limit),
# gpu_check.log (this script's whole output), summary.md. bench.jsonl records peak GPU memory per run;
# agreement.json is rewritten after each variant.
set -uo pipefail
OUT=${1:?usage: bash bench/gpu_check.sh OUT_DIR [speed|sequential|table|ablation|fixes|headline|densepure|preflight|serve|all]}
PART=${2:-speed}
DRY_RUN=${DRY_RUN:-0}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

# run_step NAME LIMIT_S LOG COMMAND...: run COMMAND under `timeout LIMIT_S`, output to OUT/LOG,
# one line to steps.tsv; returns the command's exit status (124: it ran past its limit).
run_step() {
    local name=$1 limit=$2 log=$3
    shift 3
    echo "== $(date -u +%H:%M:%S) $name (limit ${limit} s, log $log)"
    if [ "$DRY_RUN" = 1 ]; then
        echo "   $*"
        return 0
    fi
    local start=$SECONDS code
    timeout "$limit" "$@" > "$OUT/$log" 2>&1
    code=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - start))" "$limit" >> "$OUT/steps.tsv"
    [ "$code" = 124 ] && echo "   $name ran past its ${limit} s limit"
    tail -n 40 "$OUT/$log"
    return "$code"
}

# Steps that two parts share (sequential and fixes; table and fixes), each written once.
SEQUENTIAL_DEMO=($PY -m diffsmooth.bench.sequential --device cuda --precision fp16 --quiet --out "$OUT/sequential")
TABLE_DEMO=($PY -m diffsmooth.bench.table_gpu --out "$OUT/table" --images ${TABLE_IMAGES:-8} --n-max 500)
SEQUENTIAL_CUDA=($PY -m diffsmooth.cli certify --sequential --radii 0.25,0.5,0.75,1.0 --n-max 10000 --method diffsmooth \
    --sigma 0.5 --local-sigma 0.25 --m 5 --skip 25 --device cuda --precision fp16 --compile --quiet \
    --out "$OUT/sequential_cuda.tsv")

stop() { echo "gpu_check: $1 failed, stopping (see $OUT/$2)"; exit 1; }

setup() {
    run_step install ${INSTALL_LIMIT:-15} install.log \
        $PY -m pip install --no-deps --no-build-isolation -e . || stop install install.log
    run_step import ${IMPORT_LIMIT:-15} import.log $PY -c "
import torch, diffsmooth.engine.runs.assemble, diffsmooth.bench.harness
assert torch.cuda.is_available(), 'no CUDA device visible to torch'
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0))
try:
    import tensorrt; print('tensorrt', tensorrt.__version__)
except ImportError:
    print('tensorrt not installed: TensorRT path not checked')
" || stop import import.log
}

# Issue 45's variants (bench/variants.py): each CIFAR-10 variant is measured after today's default in one
# process (its compile counts as warm-up; a variant that would end past the deadline is not started and
# the summary says so); ImageNet's default beside the best guess at a larger batch; every variant's
# agreement with eager fp32. Override the lists with CIFAR_VARIANTS / IMAGENET_VARIANTS / AGREEMENT_VARIANTS.
CIFAR_VARIANTS=${CIFAR_VARIANTS:-default,pack-images=2,triton-blocks,classifier-max-autotune,pack-images=2+classifier-max-autotune,freezing,coordinate-descent,triton-conv,max-autotune}
IMAGENET_VARIANTS=${IMAGENET_VARIANTS:-default,batch=128}
AGREEMENT_VARIANTS=${AGREEMENT_VARIANTS:-pack-images=2,triton-blocks,classifier-max-autotune,pack-images=2+classifier-max-autotune,freezing,coordinate-descent,triton-conv,max-autotune}

part_speed() {
    run_step cifar10-variants ${CIFAR_LIMIT:-210} bench_cifar10.txt \
        $PY -m diffsmooth.cli bench --models cifar10 --device cuda --precision fp16 --n 100000 --m 5 \
        --measure-n ${CIFAR_MEASURE_N:-4000} --quiet --results "$OUT/bench.jsonl" \
        --variants "$CIFAR_VARIANTS" --deadline-s $(( ${CIFAR_LIMIT:-210} - 10 ))
    run_step imagenet-variants ${IMAGENET_LIMIT:-180} bench_imagenet.txt \
        $PY -m diffsmooth.cli bench --models imagenet --device cuda --precision fp16 --n 10000 --m 5 \
        --measure-n ${IMAGENET_MEASURE_N:-320} --quiet --results "$OUT/bench.jsonl" --no-reference \
        --profile "$OUT/profile-imagenet" --variants "$IMAGENET_VARIANTS" --deadline-s $(( ${IMAGENET_LIMIT:-180} - 10 ))
    run_step agreement ${AGREEMENT_LIMIT:-110} agreement.txt \
        $PY -m diffsmooth.bench.agreement --device cuda --images 12 --samples 2000 --out "$OUT/agreement.json" \
        --variant "compiled fp16 (fast path)" --variants "$AGREEMENT_VARIANTS"
}

part_sequential() {
    run_step sequential-demo ${SEQUENTIAL_LIMIT:-300} sequential.txt \
        "${SEQUENTIAL_DEMO[@]}"
    # The packed sequential CIFAR-10 run (fast path, n-max 100,000, 50 images): full-size UNet + ResNet-110
    # (random weights) whose images ask for what the measured 100k demo rows' images needed, timed
    # against fixed-n at the same measured rate (bench/packing.py --replay-rows).
    ROWS=bench/results/sequential_cpu_rs_500x100000/sequential.tsv
    [ -f "$ROWS" ] || ROWS=bench/results/sequential_cpu_rs_500x10000/sequential.tsv
    run_step sequential-cifar10-packed ${PACKED_LIMIT:-190} sequential_cifar10_packed.txt \
        $PY -m diffsmooth.bench.packing --replay-rows "$ROWS" --models cifar10 --device cuda --precision fp16 \
        --images 50 --batches 2000 --n-max 100000 --out "$OUT/sequential_cifar10_packed"
}

part_table() {
    run_step table-demo ${TABLE_LIMIT:-330} table_gpu.txt \
        "${TABLE_DEMO[@]}"
    run_step sequential-cuda ${SEQUENTIAL_CUDA_LIMIT:-150} sequential_cuda.txt \
        "${SEQUENTIAL_CUDA[@]}"
    # torchrun's per-batch meeting and merge on 8 gloo processes, on a host with the cores for them
    run_step ranks-merge ${RANKS_LIMIT:-20} ranks_merge.txt $PY -m diffsmooth.bench.ranks --parts merge --out "$OUT/ranks"
}

part_fixes() {
    # The GPU tests that have not passed on a GPU since their code changed first (the Triton kernels and their
    # check, the sweep, the demo pipeline), then every other GPU test (the diffusers ones need diffusers:
    # docs/gpu-check.md; the import-graph test skips where grimp is absent).
    FIXED="fused_block or tritonized or sweep or demo_pipeline or packed"
    run_step gpu-tests-fixed ${FIX_TESTS_LIMIT:-150} gpu_tests_fixed.log \
        $PY -m pytest -v -p no:cacheprovider -o addopts= --tb=short -m gpu tests/test_gpu.py tests/engine/models/test_triton_conv.py \
        tests/engine/models/test_packed_resnet.py -k "$FIXED"
    run_step gpu-tests-rest ${FIX_REST_LIMIT:-320} gpu_tests_rest.log \
        $PY -m pytest -v -p no:cacheprovider -o addopts= --tb=short -m gpu tests/ -k "not ($FIXED)"
}

part_ablation() {
    run_step cifar10-no-fused-attention ${ABLATION_LIMIT:-200} bench_cifar10_no_fused_attention.txt \
        $PY -m diffsmooth.cli bench --models cifar10 --device cuda --precision fp16 --n 100000 --m 5 \
        --measure-n ${CIFAR_MEASURE_N:-10000} --quiet --no-fused-attention --no-reference \
        --results "$OUT/ablation.jsonl"
}

part_headline() {
    # one table per line, as the 2026-11-27 measurement ran them (its samples per line are the comparison)
    run_step headline-diffsmooth ${HEADLINE_DS_LIMIT:-320} headline_diffsmooth.txt \
        $PY -m diffsmooth.cli table --demo --rows diffsmooth --images 500 --n-max 100000 --device cuda \
        --precision fp16 --pilot 25 --quiet --out "$OUT/headline_diffsmooth"
    run_step headline-rs ${HEADLINE_RS_LIMIT:-170} headline_rs.txt \
        $PY -m diffsmooth.cli table --demo --rows rs --images 500 --n-max 100000 --device cuda \
        --precision fp16 --pilot 25 --quiet --out "$OUT/headline_rs"
}

part_densepure() {
    # DensePure on a GPU for the first time: its GPU test (compiled fp16 / bf16 against eager fp32, one graph for
    # every step), its design flip rates measured (they are estimated until then), its time per sample beside
    # DiffSmooth's at the CIFAR-10 shapes (full-size UNet + ResNet-110, random weights).
    run_step densepure-gpu-test ${DP_TEST_LIMIT:-150} densepure_gpu_test.log \
        $PY -m pytest -v -p no:cacheprovider -o addopts= --tb=short -m gpu tests/engine/base_classifier/test_densepure.py
    run_step densepure-agreement ${DP_AGREEMENT_LIMIT:-150} densepure_agreement.txt \
        $PY -m diffsmooth.bench.agreement --setup densepure --device cuda --images 8 --samples 1000 \
        --variant "eager fp16" --variant "eager bf16" --variant "compiled fp16 (fast path)" \
        --out "$OUT/densepure_agreement.json"
    run_step densepure-bench ${DP_BENCH_LIMIT:-170} bench_densepure.txt \
        $PY -m diffsmooth.cli bench --models cifar10 --method densepure --device cuda --precision fp16 --n 100000 \
        --measure-n ${DP_MEASURE_N:-2000} --quiet --no-reference --results "$OUT/bench_densepure.jsonl"
    run_step nccl-smoke ${NCCL_LIMIT:-30} nccl_smoke.txt \
        $PY -m torch.distributed.run --standalone --nproc-per-node 1 -m diffsmooth.bench.nccl_smoke --device cuda
}

part_preflight() {
    run_step preflight-demo ${PREFLIGHT_LIMIT:-120} preflight_time.txt \
        $PY -m diffsmooth.bench.preflight_time --device cuda --json "$OUT/preflight_time.json"
}

part_serve() {
    # the serve extra from carried wheels where the image lacks it (docs/gpu-check.md lists them), then its import
    if [ -n "${SERVE_WHEELS:-}" ]; then
        run_step serve-wheels ${SERVE_WHEELS_LIMIT:-30} serve_wheels.log $PY -m pip install -q --no-index --no-deps \
            --no-compile --target "$OUT/site" "$SERVE_WHEELS"/*.whl || stop serve-wheels serve_wheels.log
        export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    run_step serve-import ${SERVE_IMPORT_LIMIT:-15} serve_import.log \
        $PY -c "import fastapi, uvicorn, prometheus_client; print('serve extra:', fastapi.__version__, uvicorn.__version__)" \
        || stop serve-import serve_import.log
    # the study starts `diffsmooth serve --demo --device cuda` on 127.0.0.1 port 0 and stops it at the end
    run_step serve-load ${SERVE_LIMIT:-420} serve_load.txt \
        $PY -m studies.serve_load --model diffsmooth --device cuda --batch ${SERVE_BATCH:-2000} --concurrency 1,8 \
        --cases predict:100:16,predict:1000:8,certify:1000:8 --max-seconds 60 \
        --server-log "$OUT/serve_server.log" --out "$OUT/serve_load.md"
}

summary() {
    run_step summary ${SUMMARY_LIMIT:-10} summary.md $PY -m diffsmooth.bench.gpu_summary "$OUT"
}

case "$PART" in
    speed|sequential|table|ablation|fixes|headline|densepure|preflight|serve) ;;
    all) ;;
    *) echo "gpu_check: unknown part $PART (speed, sequential, table, ablation, fixes, headline, densepure, preflight, serve or all)"; exit 2 ;;
esac
setup
case "$PART" in
    speed) part_speed ;;
    sequential) part_sequential ;;
    table) part_table ;;
    ablation) part_ablation ;;
    fixes) part_fixes ;;
    headline) part_headline ;;
    densepure) part_densepure ;;
    preflight) part_preflight ;;
    serve) part_serve ;;
    all) part_speed; part_sequential; part_table; part_ablation ;;
esac
summary
exit 0
