#!/usr/bin/env bash
# One call on the GPU machine (see bench/RESULTS.md): install the carried wheels, build fastload there,
# run the GPU tests and the GPU benchmarks. Usage: bash bench/device_run.sh STEPS, STEPS joined by '+':
#   gputests: every cuda-marked test, then the loader's and the pipeline's files; tests: the whole suite;
#   aug: python -m bench.augment (stage ms per --transform spec, loaders alone per spec against torchvision's
#   DataLoader with the identical v2 pipeline, at SIZE px, default 176, on LINKS links to each JPEG);
#   augtrain: fastload bench --model resnet50 --size 176 --transform trivialaugment against torchvision;
#   augprobe: Nsight Compute on one TrivialAugmentWide stage (TRANSFORM picks another spec): each kernel's time;
#   example: examples/train_imagenet.py --recipe torchvision_v2 --arch resnet50 for STEPS_LIMIT (20) steps;
#   bench: python -m bench.gpu (on LINKS links to each JPEG, default 4);
#   trainprof: python -m bench.train_profile on 4 links to each JPEG, once per line of TPARGS (its arguments);
#   contention: python -m bench.host_contention once per line of CONTARGS (the training step beside busy cores);
#   engines: python -m bench.engine_contention ENGARGS (the JPEG engines beside compute, memory, copies, a model;
#   NVJPEG_VARIANT: a sed expression for nvjpeg_decoder.cpp, rebuilt and run again with VARIANT_ENGARGS added);
#   split: python -m bench.hybrid_split SPLITARGS on the pack --seekable store of LINKS (4) links to each JPEG;
#   train: fastload bench --model resnet18/50 against torchvision (DECODER=cpu|nvjpeg
#   picks FastLoader's decoders, e.g. "cpu nvjpeg", the baseline runs with the first; MODELS the models, default
#   resnet18 resnet50); profile: Nsight Compute on the tiled kernel (bench.kernel_probe) and
#   decoder="nvjpeg" against producer count (bench.probe); kernel: the warp kernel's timings (bench.probe
#   --kernel-only and bench.gpu --kernel-only), an Nsight Compute summary and per-SASS counts ($OUT/sass.csv), then
#   VARIANTS: sed expressions for warp_cuda.cu separated by ";;", each rebuilt and timed (the source restored
#   after); all = tests+bench+train; none: only the build.
# CORPUS=dense: bench, train, aug, augtrain and example run on the ImageNet-density corpus (bench.corpus
# imagenet-dense, ~0.6 bytes/pixel, built here from the same photos) instead of data/imagenet-like (~0.23); their
# output files get a _dense suffix. train takes SIZE (crop size, default 224; files then suffixed _SIZE) and LINKS
# (default 6: 12,000 samples). E.g. CORPUS=dense SIZE=160 LINKS=4 bash bench/device_run.sh train. CUDA_GRAPH=1: train
# and augtrain capture the model's step in a CUDA graph (fastload bench --cuda-graph); files get a _graph suffix.
set -o pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if compgen -G ".whl/*.whl" > /dev/null; then  # the lent GPU machine: no network, the packages carried in .whl/
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
  dpkg -x .whl/libturbojpeg0*.deb /tmp/tj && export FASTLOAD_TURBOJPEG_LIB=/tmp/tj/usr/lib/x86_64-linux-gnu/libturbojpeg.so.0
else  # a GPU machine of your own (torch with CUDA installed, libturbojpeg0 and libjpeg-turbo-progs from apt)
  python3 -m pip install -q lmdb 'PyTurboJPEG<2' torchvision matplotlib pytest pytest-timeout scikit-image \
    scikit-learn || exit 1
fi
# cjpeg/jpegtran for the tests' JPEG-kinds corpus: Debian's libjpeg-turbo-progs and its libjpeg62-turbo, carried as
# .debs (the GPU machine has neither), called through wrappers so only they see that library.
mkdir -p /tmp/tjbin
for deb in .whl/libjpeg-turbo-progs*.deb .whl/libjpeg62-turbo*.deb; do [[ -f $deb ]] && dpkg -x "$deb" /tmp/tj; done
for tool in cjpeg djpeg jpegtran; do
  [[ -x /tmp/tj/usr/bin/$tool ]] && printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/tj/usr/lib/x86_64-linux-gnu exec /tmp/tj/usr/bin/%s "$@"\n' \
    "$tool" > /tmp/tjbin/$tool && chmod +x /tmp/tjbin/$tool
done
export PATH=/tmp/tjbin:/tmp/site/bin:$PATH  # /tmp/site/bin: py-spy (bench.train_profile --py-spy)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t )) s"; grep -i "warning" "$OUT/build.log" | head -5
case ${CORPUS:-like} in
  like) base=data/imagenet-like tag="" ;;
  dense) base=data/imagenet-dense tag=_dense ;;
  *) echo "CORPUS must be 'like' (the default) or 'dense', not '$CORPUS'"; exit 1 ;;
esac
python3 -m bench.corpus imagenet data/imagenet-like --classes 10 --per-class 200 &
corpus=$!
dense=""
if [[ $base == data/imagenet-dense ]]; then  # ~1-2 min on 16 cores, beside the build
  python3 -m bench.corpus imagenet-dense $base --classes 10 --per-class 200 &
  dense=$!
fi
[[ $what == all ]] && what=tests+bench+train
# Per-SASS-instruction execution counts of the tiled kernel (bench.kernel_probe), to see where the instructions go.
sass_counts() {
  /usr/local/cuda/bin/ncu --kernel-name regex:warp_tiled --launch-skip 2 --launch-count 1 --section SourceCounters \
    -f -o "$OUT/tiled" python3 -m bench.kernel_probe > /dev/null 2>&1
  /usr/local/cuda/bin/ncu --import "$OUT/tiled.ncu-rep" --page source --print-source sass --csv > "$OUT/sass.csv" 2>&1
  rm -f "$OUT/tiled.ncu-rep"
}
if [[ +$what+ == *+tests+* ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/ > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal Python" "$OUT/tests.log" | tail -15
fi
if [[ +$what+ == *+gputests+* ]]; then
  python3 -m pytest -q -p no:cacheprovider -m cuda tests > "$OUT/gputests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal Python" "$OUT/gputests.log" | tail -25
  python3 -m pytest -q -p no:cacheprovider tests/test_loader.py tests/test_pipeline.py tests/test_nvjpeg.py \
    > "$OUT/gputests2.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|Fatal Python" "$OUT/gputests2.log" | tail -15
fi
wait $corpus
[[ -n $dense ]] && { wait $dense || { echo "the dense corpus failed to build"; exit 1; }; }
if [[ +$what+ == *+bench+* ]]; then
  # LINKS links to each JPEG (default 4: 8,000 samples, 31 batches of 256 per epoch): with the bare 2,000 (7
  # batches) epoch start and end dominate the loader rows, which then vary by +-20% from run to run.
  links=${LINKS:-4} data=$base
  if (( links > 1 )); then
    python3 -c "from bench.corpus import linked_copies; linked_copies('$data', '$data-x$links', $links)"
    data=$data-x$links
  fi
  python3 -m bench.gpu --data $data --epochs 3 --json "$OUT/gpu$tag.json" 2>&1 | tee "$OUT/gpu$tag.log" | \
    grep -v "^fastload stats"
fi
if [[ +$what+ == *+aug+* || +$what+ == *+augtrain+* || +$what+ == *+augprobe+* || +$what+ == *+example+* ]]; then
  links=${LINKS:-4} data=$base
  python3 -c "from bench.corpus import linked_copies; linked_copies('$data', '$data-x$links', $links)"
  data=$data-x$links
fi
if [[ +$what+ == *+aug+* ]]; then
  python3 -m bench.augment --data $data --size ${SIZE:-176} --epochs 2 --json "$OUT/augment$tag.json" $AUGARGS 2>&1 | \
    tee "$OUT/augment$tag.log" | grep -v "%|"
fi
if [[ +$what+ == *+augprobe+* ]]; then  # Nsight Compute on one TrivialAugmentWide stage: each kernel's time
  /usr/local/cuda/bin/ncu --profile-from-start off --section SpeedOfLight --section Occupancy \
    python3 -m bench.augment --data $data --size ${SIZE:-176} --probe ${TRANSFORM:-trivialaugment} \
    > "$OUT/augprobe.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|Achieved Occupancy|Registers Per" "$OUT/augprobe.txt" | \
    sed -E 's/void fastload::\(anonymous namespace\)::|fastload::\(anonymous namespace\)::|void //'
fi
if [[ +$what+ == *+augtrain+* ]]; then
  timeout ${TRAIN_TIMEOUT:-500} python3 -m fastload bench $data --device cuda --model resnet50 --size ${SIZE:-176} \
    --transform ${TRANSFORM:-trivialaugment} --baseline torchvision --epochs 1 -q ${CUDA_GRAPH:+--cuda-graph} \
    --json "$OUT/augtrain$tag${CUDA_GRAPH:+_graph}.json" 2>"$OUT/augtrain$tag.err" | \
    tee "$OUT/augtrain$tag${CUDA_GRAPH:+_graph}.log" | tail -8
fi
if [[ +$what+ == *+example+* ]]; then  # examples/train_imagenet.py --recipe torchvision_v2 with ResNet-50, a few steps
  timeout 300 python3 examples/train_imagenet.py --train $data --recipe torchvision_v2 --arch resnet50 --epochs 1 \
    --limit-steps ${STEPS_LIMIT:-20} --print-every 5 --checkpoint /tmp/example.pt 2>&1 | tee "$OUT/example$tag.log" | \
    tail -6
fi
if [[ +$what+ == *+profile+* ]]; then
  /usr/local/cuda/bin/ncu --kernel-name regex:warp_tiled --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section SchedulerStats --section InstructionStats python3 -m bench.kernel_probe \
    > "$OUT/ncu.txt" 2>&1
  grep -E "^ +(Duration|Executed Ipc Active|Issue Slots Busy|Achieved Occupancy|Executed Instructions|Memory Throughput|Compute \(SM\) Throughput) " \
    "$OUT/ncu.txt"
  sass_counts
  python3 -c "from bench import corpus; corpus.seekable_store('data/imagenet-like')" > /dev/null
  python3 -m bench.probe --data data/imagenet-like --nvjpeg-workers data/imagenet-like.seekable.lmdb 2>&1 | tee "$OUT/nvjpeg_workers.log"
fi
if [[ +$what+ == *+kernel+* ]]; then
  python3 -m bench.probe --data data/imagenet-like --kernel-only 2>&1 | tail -6
  python3 -m bench.gpu --data data/imagenet-like --kernel-only
  /usr/local/cuda/bin/ncu --kernel-name regex:warp_tiled --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats \
    --section MemoryWorkloadAnalysis_Tables python3 -m bench.kernel_probe > "$OUT/ncu.txt" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Executed Instructions  |Achieved Occupancy|-way bank" "$OUT/ncu.txt"
  sass_counts
  cp fastload/native/warp_cuda.cu /tmp/warp_cuda.cu.orig  # the device's checkout has no usable git history
  IFS=$'\n' read -d '' -r -a exprs < <(printf '%s' "$VARIANTS" | sed 's/;;/\n/g')
  for expr in "${exprs[@]}"; do
    [[ -z $expr ]] && continue
    cp /tmp/warp_cuda.cu.orig fastload/native/warp_cuda.cu; sed -i "$expr" fastload/native/warp_cuda.cu
    cmp -s /tmp/warp_cuda.cu.orig fastload/native/warp_cuda.cu && echo "variant changed nothing: $expr"
    python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build_variant.log" 2>&1 || tail -5 "$OUT/build_variant.log"
    echo "variant: $expr"; python3 -m bench.probe --data data/imagenet-like --kernel-only 2>&1 | tail -5
  done
  if [[ -n $VARIANTS ]]; then
    cp /tmp/warp_cuda.cu.orig fastload/native/warp_cuda.cu
    python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1
  fi
fi
if [[ +$what+ == *+trainprof+* ]]; then  # bench.train_profile on the 8,000-sample folder: one line of TPARGS a run
  python3 -c "from bench.corpus import linked_copies; linked_copies('$base', '$base-x4', 4)"
  lscpu | grep -E "^(Model name|Thread|Core|Socket|CPU\(s\))"
  while IFS= read -r args; do
    [[ -z $args ]] && continue
    echo "train_profile $args"
    timeout ${TRAIN_TIMEOUT:-300} python3 -m bench.train_profile $base-x4 $args 2>&1 | tee -a "$OUT/trainprof.log" | \
      grep -E "^\||^cores used"
  done <<< "${TPARGS:---decoder cpu hybrid}"
fi
if [[ +$what+ == *+contention+* ]]; then  # the training step alone, beside spinning / memory-streaming processes
  while IFS= read -r args; do
    [[ -z $args ]] && continue
    timeout ${TRAIN_TIMEOUT:-300} python3 -m bench.host_contention $args 2>&1 | tee -a "$OUT/contention.log" | grep "^|"
  done <<< "${CONTARGS:---model resnet50 --size 176}"
fi
if [[ +$what+ == *+engines+* ]]; then  # bench.engine_contention: the JPEG engines beside one kind of GPU work at a time
  python3 -m bench.engine_contention --data $base $ENGARGS 2>&1 | tee "$OUT/engines.log" | grep -E "^\||^round|batch"
  if [[ -n $NVJPEG_VARIANT ]]; then  # a sed expression for nvjpeg_decoder.cpp: rebuilt, run again, restored
    cp fastload/native/nvjpeg_decoder.cpp /tmp/nvjpeg_decoder.cpp.orig
    sed -i "$NVJPEG_VARIANT" fastload/native/nvjpeg_decoder.cpp
    cmp -s /tmp/nvjpeg_decoder.cpp.orig fastload/native/nvjpeg_decoder.cpp && echo "variant changed nothing"
    t=$(date +%s)
    python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build_variant.log" 2>&1 || tail -5 "$OUT/build_variant.log"
    echo "variant ($NVJPEG_VARIANT), build $(( $(date +%s) - t )) s"
    python3 -m bench.engine_contention --data $base $ENGARGS ${VARIANT_ENGARGS} 2>&1 | tee "$OUT/engines_variant.log" | \
      grep -E "^\||^round|batch"
    cp /tmp/nvjpeg_decoder.cpp.orig fastload/native/nvjpeg_decoder.cpp  # and rebuilt: later steps run the tree's code
    python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || tail -5 "$OUT/build.log"
  fi
fi
if [[ +$what+ == *+split+* ]]; then  # decoder="hybrid" splits, loaders alone (bench/hybrid_split.py)
  links=${LINKS:-4}; data=$base-x$links
  python3 -c "from bench.corpus import linked_copies; linked_copies('$base', '$data', $links)"
  python3 -m fastload pack $data $data.seekable.lmdb --seekable --workers 16 -q --resume 2>&1 | tail -1
  lscpu | grep -E "^(Model name|CPU\(s\))"
  timeout ${TRAIN_TIMEOUT:-480} python3 -m bench.hybrid_split $data.seekable.lmdb $SPLITARGS 2>&1 | \
    tee "$OUT/split$tag.log" | tail -25
fi
if [[ +$what+ == *+train+* ]]; then
  # 12,000 samples (LINKS=6 links to each of the 2,000 real JPEGs, page-cached) so an epoch is ~47 batches of 256:
  # epoch start/end effects stay small for both loaders.
  links=${LINKS:-6}; data=$base-x$links; suffix=$tag${SIZE:+_$SIZE}${CUDA_GRAPH:+_graph}
  python3 -c "from bench.corpus import linked_copies; linked_copies('$base', '$data', $links)"
  python3 -m fastload pack $data $data.seekable.lmdb --seekable --workers 16 -q --resume 2>&1 | tail -1
  for m in ${MODELS:-resnet18 resnet50}; do
    for d in ${DECODER:-cpu}; do  # the torchvision baseline with the first decoder only
      [[ $d == ${DECODER%% *} || -z $DECODER ]] && baseline="--baseline torchvision" || baseline=""
      timeout ${TRAIN_TIMEOUT:-1200} python3 -m fastload bench $data.seekable.lmdb --device cuda \
        --decoder $d $baseline --model $m --size ${SIZE:-224} --epochs 2 ${CUDA_GRAPH:+--cuda-graph} --json "$OUT/train_${m}_$d$suffix.json" \
        2>"$OUT/train_${m}_$d$suffix.err" | tee "$OUT/train_${m}_$d$suffix.log" | tail -8
    done
  done
fi
