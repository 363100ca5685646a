#!/usr/bin/env bash
# DALI for a lent GPU machine (Python 3.12, no DALI, no network) in as few device calls as possible.
# The wheels (~260 MB) are unpacked, cut to Python 3.12 (other ABIs' extension modules, headers,
# nvCOMP: DALI loads it only for its decompression operators), stripped of symbol tables and
# compressed with xz: ~137 MB in 3 parts, against 5 parts as plain wheels. dill and braceexpand
# come along (the package needs them; the GPU image has neither), and the full-size photos that
# benchmarks/gpu_check.sh --prepare makes its data of, which starts in the first call.
#
#   DALI_SHARDS_BENCH_PHOTOS=full-size-photos/ bash benchmarks/gpu_wheels.sh   # prints the calls to make
#
# Each part travels in a top-level folder of its own and each call moves it to /tmp at once: a call
# that carries a folder replaces that folder on the device, so parts left in the repository are lost.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
work=${GPU_WHEELS_WORK:-/tmp/dali-shards-gpu-wheels}
if [ ! -f "$work/site.tar.xz" ]; then
    rm -rf "$work" && mkdir -p "$work/wheels" "$work/site"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$work/wheels" \
        nvidia-dali-cuda130==2.4.0 nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg astunparse==1.6.3 gast==0.7.0 \
        optree nvtx makefun "libcst~=1.8" six dill braceexpand
    for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/site"; done
    find "$work/site" -name "*.cpython-*" ! -name "*cpython-312-*" -delete
    rm -rf "$work/site/nvidia/dali/include" "$work/site/nvidia/cu13/include" "$work/site/nvidia/nvimgcodec/include"
    find "$work/site" -name "*.so*" -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
    tar -C "$work/site" -cf - . | xz -9 -T0 > "$work/site.tar.xz"
fi
size=$(stat -c %s "$work/site.tar.xz")
part=60000000
n=$(((size + part - 1) / part))
for i in $(seq 1 "$n"); do
    d=.gpuw$i
    grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
    rm -rf "$d" && mkdir -p "$d"
    dd if="$work/site.tar.xz" of="$d/part" bs=1M iflag=skip_bytes,count_bytes skip=$(((i - 1) * part)) count="$part" status=none
done
# .gpuw0: what the data's preparation needs before DALI arrives (the photos, dill, braceexpand)
grep -qx "/.gpuw0/" .git/info/exclude 2>/dev/null || echo "/.gpuw0/" >> .git/info/exclude
rm -rf .gpuw0 && mkdir -p .gpuw0/py
for w in "$work"/wheels/dill-*.whl "$work"/wheels/braceexpand-*.whl; do unzip -q -o "$w" -d .gpuw0/py; done
[ -n "${DALI_SHARDS_BENCH_PHOTOS:-}" ] && cp -r "$DALI_SHARDS_BENCH_PHOTOS" .gpuw0/photos
echo "$n parts of at most $part bytes. Make these device \`run\` calls back to back (warm ~30 s between calls):"
echo "  1. carry [\".gpuw$n\", \".gpuw0\"]   command: mkdir -p /tmp/parts && mv .gpuw$n/part /tmp/parts/$n &&" \
     "cp -r .gpuw0/py /tmp/py && cp -r .gpuw0/photos /tmp/photos && (PYTHONPATH=/tmp/py:\$PWD" \
     "DALI_SHARDS_BENCH_PHOTOS=/tmp/photos setsid nohup bash benchmarks/gpu_check.sh --prepare > /tmp/prep.log 2>&1 < /dev/null &)"
for i in $(seq 1 $((n - 1))); do
    cmd="mkdir -p /tmp/parts && mv .gpuw$i/part /tmp/parts/$i"
    [ "$i" -eq $((n - 1)) ] && cmd="$cmd && mkdir -p /tmp/site && cat \$(ls -v /tmp/parts/*) | xz -d -T0 | tar -x -C /tmp/site && cp -r /tmp/py/* /tmp/site/ && echo DALI ready"
    echo "  $((i + 1)). carry [\".gpuw$i\"]   command: $cmd"
done
echo "Then (or in the last call, after 'DALI ready'): export PYTHONPATH=/tmp/site:\$PWD DALI_SHARDS_BENCH_PHOTOS=/tmp/photos;"
echo "bash benchmarks/gpu_check.sh \$OUT 540"
