"""Augmentation on the GPU, side by side in one run (needs CUDA):

(a) the stage per batch: the plain fused warp + normalise against the same warp with a policy's per-sample
    photometric ops (a TrivialAugmentWide / RandAugment table drawn for the batch) and the normalisation after
    them; GPU time only (bench.gpu.cuda_time), batch of realistic RandomResizedCrop windows;
(b) finished batches per second of FastLoader(device="cuda") with each --transform spec (fastload.benchmark.pipelines:
    RandomResizedCrop + flip + [policy] + ToDtype + Normalize), against torchvision's DataLoader running the
    identical torchvision v2 pipeline (``--workers`` processes, pinned, copied to the GPU).

    python -m bench.augment --data DIR [--size 176] [--epochs 2] [--json out.json]
"""
import argparse
import json
import os

import numpy as np
import torch

import fastload as fl
from bench.gpu import cuda_time, fastload_rate
from fastload import benchmark

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SPECS = ("plain", "trivialaugment", "randaugment", "autoaugment", "torchvision_v2", "threeaugment")


def stage_bench(ds, size, batch):
    """GPU ms per batch of the loader's stage (Pipeline.run) for each spec, on one decoded batch."""
    idx = np.arange(batch)
    rows = []
    for spec in SPECS:
        pipeline = fl.transforms.Pipeline.build(benchmark.pipelines(spec, size)[0])
        params = pipeline.sample_params(0, 0, idx, pin=True)  # as the loader makes them
        # the crop's geometry (a BILINEAR policy's rotate/shear/translate would fold into each sample's matrix)
        plan = pipeline.plan(np.asarray(ds.heights)[idx % len(ds)], np.asarray(ds.widths)[idx % len(ds)], 0, 0,
                             idx % len(ds))
        with ds.reader() as r:
            data, offsets, shapes, status, msgs = fl.ops.decode_crops([r.get(int(i)) for i in idx % len(ds)],
                                                                      plan.windows, threads=os.cpu_count())
        assert int(status.abs().sum()) == 0, msgs
        dev = [t.cuda() for t in (data, offsets, shapes, plan.matrices)]

        def run():
            return pipeline.run(*dev, params, channels_last=True)
        rows.append((spec, cuda_time(run)))
        if params.table is not None:  # where the time goes: the warp to uint8, then the photometric op
            def warp():
                return fl.ops.warp_ragged(*dev, size, in_scale=1.0, out_dtype=torch.uint8)
            x = warp()
            table = params.table
            rows.append((f"  {spec}: warp to uint8", cuda_time(warp)))
            nearest = None
            if params.nearest is not None:
                samples, matrices, at = params.nearest.on(x.device)
                nearest = (samples, matrices, pipeline.fill[0], at)
            slots = f"{table.ops.shape[1]} slot(s)"
            if nearest is not None:
                moved = f"{len(params.nearest.samples)} samples"
                rows.append((f"  {spec}: photometric op ({slots}), float32 channels_last, reading {moved} through "
                             f"their nearest maps (the stage's)",
                             cuda_time(lambda: fl.transforms.functional.photometric(
                                 x, table, mean=MEAN, std=STD, channels_last=True, nearest=nearest))))
                # what the stage no longer runs: a pass of its own for the rotate/shear/translate (in place on a
                # copy: each call turns the samples again, at the same cost)
                y = x.clone()
                first = [k for k, slot in enumerate(at) if slot == at[0]]  # one slot's: distinct samples
                rows.append((f"  {spec}: for reference, affine_nearest_ on the {len(first)} samples of one slot "
                             f"as a pass of its own",
                             cuda_time(lambda: fl.ops.affine_nearest_(y, samples[first], matrices[first],
                                                                      pipeline.fill[0]))))
            rows.append((f"  {spec}: photometric op ({slots}), float32 channels_last, no maps",
                         cuda_time(lambda: fl.transforms.functional.photometric(x, table, mean=MEAN, std=STD,
                                                                                channels_last=True))))
        if pipeline.batch_ops:  # the stage leaves the last RandomErasing to the batch ops: one fused pass
            out = run()
            y = torch.arange(batch, device="cuda") % 1000
            op = pipeline.batch_ops[0]
            plans = {}  # a batch per batch op RandomChoice picks among (MixUp, CutMix)
            for k in range(64):
                plan = pipeline.batch_plan(0, 0, k, batch)
                plans.setdefault(plan[0][0] if hasattr(op, "transforms") else 0, plan)
            for choice, plan in sorted(plans.items()):
                name = type(op.transforms[choice] if hasattr(op, "transforms") else op).__name__
                rows.append((f"  {spec}: RandomErasing + {name}, one pass after the stage",
                             cuda_time(lambda: pipeline.mix_images(out, plan, params))))
                rows.append((f"  {spec}: the same + the targets on the GPU (FastLoader makes them on the host)",
                             cuda_time(lambda: pipeline.apply_batch_ops(out, y, plan, params))))
    return rows


def probe(ds, spec, size, batch):
    idx = np.arange(batch) % len(ds)
    pipeline = fl.transforms.Pipeline.build(benchmark.pipelines(spec, size)[0])
    params = pipeline.sample_params(0, 0, np.arange(batch))
    plan = pipeline.plan(np.asarray(ds.heights)[idx], np.asarray(ds.widths)[idx], 0, 0, np.arange(batch))
    with ds.reader() as r:
        data, offsets, shapes, _, _ = fl.ops.decode_crops([r.get(int(i)) for i in idx], plan.windows,
                                                          threads=os.cpu_count())
    dev = [t.cuda() for t in (data, offsets, shapes, plan.matrices)]
    for _ in range(3):
        pipeline.run(*dev, params, channels_last=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    pipeline.run(*dev, params, channels_last=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def loader_rate(ds, spec, size, batch, epochs):
    return fastload_rate(ds, epochs, batch, None, transform=benchmark.pipelines(spec, size)[0])[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder of JPEGs (e.g. from python -m bench.corpus imagenet)")
    p.add_argument("--size", type=int, default=176)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="torchvision DataLoader workers")
    p.add_argument("--specs", default="plain,trivialaugment,randaugment", help="--transform specs for (b)")
    p.add_argument("--rounds", type=int, default=2, help="loader runs per spec, in alternating order")
    p.add_argument("--skip-torchvision", action="store_true")
    p.add_argument("--stage-only", action="store_true", help="only (a)")
    p.add_argument("--probe", metavar="SPEC", help="run SPEC's stage once between cudaProfilerStart/Stop (after a "
                   "warm-up) and exit: for `ncu --profile-from-start off`")
    p.add_argument("--json")
    args = p.parse_args(argv)
    ds = fl.FolderDataset(args.data)
    if args.probe:
        return probe(ds, args.probe, args.size, args.batch_size)
    print(f"{torch.cuda.get_device_name()} | {os.cpu_count()} cores | {len(ds)} images | {args.size} px | "
          f"batch {args.batch_size}", flush=True)
    stage = stage_bench(ds, args.size, args.batch_size)
    specs = [] if args.stage_only else args.specs.split(",")
    # Rounds in alternating order (plain first, then last...): the first loader of a process runs on a colder
    # machine, and runs drift by +-10%; each spec's figure is its mean over the rounds.
    runs = {spec: [] for spec in specs}
    for r in range(args.rounds):
        for spec in (specs if r % 2 == 0 else specs[::-1]):
            runs[spec].append(loader_rate(ds, spec, args.size, args.batch_size, args.epochs))
    rates = {spec: sum(v) / len(v) for spec, v in runs.items()}
    tv = {} if args.skip_torchvision else {
        spec: benchmark.torchvision_rate(ds, batch_size=args.batch_size, workers=args.workers, epochs=args.epochs,
                                         device="cuda", size=args.size, progress=False, transform=spec)
        for spec in specs if spec != "plain"}

    plain_ms = stage[0][1]
    print(f"\n(a) the stage on the GPU, batch of {args.batch_size} RandomResizedCrop windows -> {args.size} px, "
          f"float32 channels_last")
    print(f"{'pipeline':<70} {'ms':>8} {'x plain':>8}")
    for spec, ms in stage:
        print(f"{spec:<70} {ms:8.3f} {ms / plain_ms:8.2f}")
    print(f"\n(b) finished batches on the GPU, images/s ({args.epochs} timed epochs after a warm-up)")
    print(f"{'pipeline':<60} {'img/s':>9} {'% plain':>8}  each round")
    for spec, rate in rates.items():
        print(f"{'fastload FastLoader, ' + spec:<60} {rate:9.0f} {100 * rate / rates[specs[0]]:7.1f}%  "
              + " / ".join(f"{v:.0f}" for v in runs[spec]))
    for spec, rate in tv.items():
        print(f"{'torchvision DataLoader (' + str(args.workers) + ' workers), ' + spec:<60} {rate:9.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stage_ms": dict(stage), "fastload": rates, "fastload_rounds": runs, "torchvision": tv, "size": args.size}, f)


if __name__ == "__main__":
    main()
