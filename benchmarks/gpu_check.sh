#!/usr/bin/env bash
# The GPU verification in one command, for a lent GPU machine with DALI importable (PYTHONPATH):
# the GPU-only tests, benchmarks/gpu.py (mixed decode vs DALI's native reader at 2, 8 and 16
# workers; the ring's bytes-only scaling; CPU per step, ours and DALI's), the ResNet-50 example
# (AMP, channels-last) over epochs of 160 steps beside its no-loader speed, the detection example, then the pipeline tier
# with whatever time is left. Every step has its own time limit and writes under OUT as it goes.
#
#   DALI_SHARDS_BENCH_PHOTOS=folder bash benchmarks/gpu_check.sh --prepare   # the data (no DALI needed)
#   DALI_SHARDS_BENCH_PHOTOS=folder bash benchmarks/gpu_check.sh OUT [SECONDS]
#
# DALI_SHARDS_BENCH_PHOTOS: full-size photos, one folder per class id (see benchmarks/bench_data.py).
# --prepare can run ahead (while DALI's wheels are still travelling); the check waits for it.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
data=benchmarks/data
prepared=$data/gpu-prepared
copies=$data/bench-4096x256-x10  # the 4,096 photos' shards 10 times: training epochs of 160 steps

if [ "${1:-}" = "--prepare" ]; then
    python3 benchmarks/gpu.py --data-only --data-dir "$data" || exit 1
    mkdir -p "$copies"
    for r in $(seq 0 9); do
        for i in $(seq 0 15); do
            cp "$data/bench-4096x256/bench-$(printf %06d "$i").tar" "$copies/bench-$(printf %06d $((r * 16 + i))).tar"
        done
    done
    touch "$prepared"
    exit 0
fi

out=${1:?usage: gpu_check.sh OUT [SECONDS] | --prepare}
budget=${2:-470}
mkdir -p "$out"
deadline=$((SECONDS + budget))
log() { echo "== $(date +%T) [$SECONDS s] $*" | tee -a "$out/log.txt"; }
left() { local s=$((deadline - SECONDS - 5)); [ "$s" -gt "$1" ] && echo "$1" || echo $((s > 1 ? s : 1)); }

log "versions"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$out/log.txt"
python3 -c "import nvidia.dali, torch, numpy; print('DALI', nvidia.dali.__version__, 'torch', torch.__version__, 'CUDA', torch.version.cuda, 'numpy', numpy.__version__)" 2>&1 | tee -a "$out/log.txt"

log "data: waiting for --prepare (or making it)"
for _ in $(seq 1 90); do [ -f "$prepared" ] && break; sleep 1; done
[ -f "$prepared" ] || bash "$0" --prepare 2>&1 | tail -3 | tee -a "$out/log.txt"

log "GPU-only tests"
timeout "$(left 80)" python3 -m pytest -q -p no:cacheprovider -m gpu tests/pipeline/test_gpu.py 2>&1 | tail -25 > "$out/pytest_gpu.txt"
tail -3 "$out/pytest_gpu.txt" | tee -a "$out/log.txt"

log "benchmark: mixed decode vs the native reader, 2/8/16 workers (2 rounds; merge 1); bytes-only scaling"
timeout "$(left 270)" python3 benchmarks/gpu.py --workers 2,8,16 --rounds 2 --merge-rounds 1 --epochs 4 --timeout 60 \
    --data-dir "$data" --out-dir "$out" 2>&1 | tee -a "$out/log.txt"

log "ResNet-50 with no loader: the ceiling the example's speed is compared with"
timeout "$(left 40)" python3 benchmarks/train_ceiling.py --arch resnet50 --out "$out/train_ceiling.json" 2>&1 | tail -1 | tee -a "$out/log.txt"

log "ResNet-50 example: AMP, channels-last, 3 epochs of 160 steps (40,960 images), 8 workers"
timeout "$(left 110)" python3 examples/imagenet_tar_train.py --arch resnet50 \
    --data "$copies/bench-{000000..000159}.tar" --val-data "$data/bench-4096x256/bench-{000000..000015}.tar" \
    --epochs 3 --workers 8 --threads 8 --out-dir /tmp/runs --log-json "$out/train.jsonl" 2>&1 | tail -8 | tee -a "$out/log.txt"

log "detection example: a few steps"
timeout "$(left 45)" python3 examples/detection_train.py --steps-per-epoch 6 --out-dir /tmp/det 2>&1 | tail -8 > "$out/detection.txt"
tail -4 "$out/detection.txt" | tee -a "$out/log.txt"

log "pipeline tier on the GPU machine (8 test processes) until the deadline"
timeout "$(left 600)" python3 -m pytest -q -p no:cacheprovider -n 8 tests/pipeline 2>&1 | tail -40 > "$out/pytest_pipeline.txt"
tail -5 "$out/pytest_pipeline.txt" | tee -a "$out/log.txt"
log "done"
