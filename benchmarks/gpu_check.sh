#!/usr/bin/env bash
# The GPU verification in one command, for a lent GPU machine with DALI importable (PYTHONPATH):
# the GPU-only tests, benchmarks/gpu.py (mixed decode vs DALI's native reader at 2, 8 and 16
# workers; the ring's bytes-only scaling), the ResNet-50 example (AMP, channels-last) and the
# detection example, then the pipeline tier on the GPU machine with whatever time is left.
# Every step has its own time limit and writes its results under OUT as it goes.
#
#   DALI_SHARDS_BENCH_PHOTOS=folder bash benchmarks/gpu_check.sh OUT [SECONDS]
#
# DALI_SHARDS_BENCH_PHOTOS: full-size photos, one folder per class id (see benchmarks/bench_data.py).
set -u
out=${1:?usage: gpu_check.sh OUT [SECONDS]}
budget=${2:-480}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
deadline=$((SECONDS + budget))
log() { echo "== $(date +%T) [$SECONDS s] $*" | tee -a "$out/log.txt"; }
left() { local s=$((deadline - SECONDS - 5)); [ "$s" -gt "$1" ] && echo "$1" || echo $((s > 1 ? s : 1)); }

log "versions"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$out/log.txt"
python3 -c "import nvidia.dali, torch, numpy; print('DALI', nvidia.dali.__version__, 'torch', torch.__version__, 'CUDA', torch.version.cuda, 'numpy', numpy.__version__)" 2>&1 | tee -a "$out/log.txt"

log "GPU-only tests"
timeout "$(left 150)" python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -25 > "$out/pytest_gpu.txt"
tail -3 "$out/pytest_gpu.txt" | tee -a "$out/log.txt"

log "benchmark: mixed decode vs the native reader, 2/8/16 workers; bytes-only scaling"
timeout "$(left 230)" python3 benchmarks/gpu.py --workers 2,8,16 --timeout 60 --out-dir "$out" 2>&1 | tee -a "$out/log.txt"

data="benchmarks/data/bench-4096x256/bench-{000000..000015}.tar"
log "ResNet-50 example: AMP, channels-last, 3 short epochs of 4096 images"
timeout "$(left 90)" python3 examples/imagenet_tar_train.py --arch resnet50 --data "$data" --val-data "$data" \
  --epochs 3 --workers 8 --threads 8 --out-dir /tmp/runs --log-json "$out/train.jsonl" 2>&1 | tail -8 | tee -a "$out/log.txt"

log "detection example: a few steps"
timeout "$(left 60)" python3 examples/detection_train.py --steps-per-epoch 6 --out-dir /tmp/det 2>&1 | tail -8 > "$out/detection.txt"
tail -4 "$out/detection.txt" | tee -a "$out/log.txt"

log "pipeline tier on the GPU machine (8 test processes) until the deadline"
timeout "$(left 600)" python3 -m pytest -q -p no:cacheprovider -n 8 tests/pipeline 2>&1 | tail -40 > "$out/pytest_pipeline.txt"
tail -5 "$out/pytest_pipeline.txt" | tee -a "$out/log.txt"
log "done"
