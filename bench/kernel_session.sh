# build + GPU tests + kernel table + ncu summary/sass (used from the device tool during kernel work)
bash bench/device_run.sh ${STEPS:-gputests} 2>&1 | tail -6
export PYTHONPATH=/tmp/site FASTLOAD_TURBOJPEG_LIB=/tmp/tj/usr/lib/x86_64-linux-gnu/libturbojpeg.so.0
grep -E "^(FAILED|ERROR)|Error" $OUT/gputests.log | head -10
python3 -m bench.probe --data data/imagenet-like --kernel-only 2>&1 | tail -6
python3 -c "
import fastload as fl
from bench.gpu import kernel_bench
rows = kernel_bench(fl.FolderDataset('data/imagenet-like'))
copy = [r for r in rows if r[0].startswith('device')][0][2]
for n, ms, bw in rows: print(f'{n[:60]:<60} {ms:7.3f} ms {bw:7.0f} GB/s {100*bw/copy:4.0f}%')
"
/usr/local/cuda/bin/ncu --kernel-name regex:warp_tiled --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis_Tables python3 -m bench.kernel_probe > $OUT/ncu.txt 2>&1
grep -E "Duration|Warp Cycles Per Issued|Executed Instructions  |Achieved Occupancy|-way bank" $OUT/ncu.txt
/usr/local/cuda/bin/ncu --kernel-name regex:warp_tiled --launch-skip 2 --launch-count 1 --section SourceCounters -f -o $OUT/tiled python3 -m bench.kernel_probe > /dev/null 2>&1
/usr/local/cuda/bin/ncu --import $OUT/tiled.ncu-rep --page source --print-source sass --csv > $OUT/sass.csv 2>&1; rm -f $OUT/tiled.ncu-rep
# Variants, kernel timing only: VARIANTS holds sed expressions for warp_cuda.cu separated by ";;" (the file is
# restored afterwards from a copy: the device's checkout has no usable git history).
cp fastload/native/warp_cuda.cu /tmp/warp_cuda.cu.orig
IFS=$'\n' read -d '' -r -a exprs < <(printf '%s' "$VARIANTS" | sed 's/;;/\n/g')
for expr in "${exprs[@]}"; do
  [[ -z $expr ]] && continue
  cp /tmp/warp_cuda.cu.orig fastload/native/warp_cuda.cu; sed -i "$expr" fastload/native/warp_cuda.cu
  cmp -s /tmp/warp_cuda.cu.orig fastload/native/warp_cuda.cu && echo "variant changed nothing: $expr"
  python3 -m pip install -q --no-build-isolation --no-deps -e . > $OUT/build_variant.log 2>&1 || tail -5 $OUT/build_variant.log
  echo "variant: $expr"; python3 -m bench.probe --data data/imagenet-like --kernel-only 2>&1 | tail -5
done
cp /tmp/warp_cuda.cu.orig fastload/native/warp_cuda.cu
