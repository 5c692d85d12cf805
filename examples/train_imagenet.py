"""Train a torchvision model on ImageNet (or any ImageFolder tree / fastload store) with fastload feeding it.

Everything a real run needs, in one file you can copy: a training loader and an evaluation loader (no shuffle)
made from a recipe (fastload.recipes), SGD with momentum and a warm-up + cosine learning rate,
bf16 autocast and channels_last on the GPU, checkpoints that include the loader's position (so a resumed run
continues with exactly the batch that would have come next, mid-epoch too), and top-1/top-5 accuracy.

One GPU (an ImageFolder tree works as it is; an LMDB store made by `fastload pack` reads faster):

    fastload pack /data/imagenet/train /data/train.lmdb
    fastload pack /data/imagenet/val   /data/val.lmdb
    python examples/train_imagenet.py --train /data/train.lmdb --val /data/val.lmdb --arch resnet50

All GPUs of one machine (each process takes its own shard; --batch-size is per GPU):

    torchrun --nproc_per_node=8 examples/train_imagenet.py --train /data/train.lmdb --val /data/val.lmdb

Several machines: put the stores (and the checkpoint) on storage every node can read (NFS, Lustre, ...),
then run the same command on every node; node0.example.com is any one of them, reachable by the others:

    torchrun --nnodes=4 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=node0.example.com:29500 \\
        --rdzv_id=resnet50-run1 examples/train_imagenet.py \\
        --train /shared/train.lmdb --val /shared/val.lmdb --checkpoint /shared/resnet50.pt

Resume after a crash or a pre-emption with the same command plus ``--resume /shared/resnet50.pt``.

Recipes (``--recipe``, fastload.recipes): ``classic`` (default): RandomResizedCrop(224) + flip; Resize(256) +
CenterCrop(224). ``torchvision_v2``: torchvision's v2 recipe at 176 px: + TrivialAugmentWide, RandomErasing(0.1),
MixUp(0.2)/CutMix(1.0) soft targets, repeated augmentation x4 under torchrun; eval Resize(232) + CenterCrop(224);
label smoothing 0.1 (the loss's, on the soft targets). ``ffcv``: FFCV's ResNet-50 recipe: 160 px growing to 192 px between epochs 65
and 76 (of 88: --epochs 88), RandomResizedCrop + flip; eval at 256 px. A recipe is the data side only: the
optimiser stays this script's (SGD, lr 0.1 per 256 images, weight decay 1e-4, 2 warm-up epochs, cosine), where
torchvision's 80.9% also takes lr 0.5 at batch 1024, weight decay 2e-5 (none on norms), 5 warm-up epochs, 600
epochs and a model EMA.

Smoke run on a CPU (a few steps of a small model on small crops, on the photos `make demo` puts in data/):

    python examples/train_imagenet.py --train data/imagenet-c10-p100-s0 --val data/imagenet-c10-p100-s0 \\
        --device cpu \\
        --arch resnet18 --size 64 --batch-size 8 --epochs 1 --limit-steps 4 --checkpoint /tmp/smoke.pt

Under torchrun, FastLoader takes its shard (rank, world size) from torch.distributed by itself and, on CUDA,
the GPU of LOCAL_RANK. The checkpoint is written by rank 0 and read by every rank.
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torchvision

import fastload as fl
from fastload import recipes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train", required=True, help="training images: an ImageFolder tree or a `fastload pack` store")
    p.add_argument("--val", help="evaluation images (same classes); no evaluation without it")
    p.add_argument("--arch", default="resnet50", help="a torchvision.models classifier name")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=256, help="images per step on each GPU (process)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: 0.1 x global batch / 256)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--recipe", choices=sorted(recipes.RECIPES), default="classic",
                   help="augmentation, loader options and label smoothing (fastload.recipes)")
    p.add_argument("--label-smoothing", type=float, default=None, help="default: the recipe's (0.1)")
    p.add_argument("--warmup-epochs", type=float, default=2.0, help="linear warm-up before the cosine decay")
    p.add_argument("--size", type=int, default=None, help="training crop size (default: the recipe's: classic 224, "
                   "torchvision_v2 176; the ffcv recipe follows its ramp)")
    p.add_argument("--val-size", type=int, default=None, help="evaluation crop size (default: the recipe's; "
                   "classic: --size)")
    p.add_argument("--val-resize", type=int, default=None, help="short side before the centre crop "
                   "(default: the recipe's: val size / 0.875 for classic and ffcv, 232 for torchvision_v2)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="fastload decode threads per producer (default: "
                   "FastLoader's, which shares the cores out among the local processes and their producers)")
    p.add_argument("--decoder", choices=["cpu", "nvjpeg", "hybrid", "auto"], default="cpu",
                   help="the training loader's JPEG decoder (FastLoader's decoder=; default cpu: the same pixels "
                   "on every machine). auto (CUDA) measures each decoder inside this loop and keeps the fastest; "
                   "the checkpoint keeps its choice. Evaluation always decodes on the cores")
    p.add_argument("--seed", type=int, default=0, help="model initialisation, shuffling and crops")
    p.add_argument("--checkpoint", default="checkpoint.pt", help="where checkpoints are written")
    p.add_argument("--save-every", type=int, default=1000, help="also checkpoint every N steps (0: epoch ends only)")
    p.add_argument("--resume", help="checkpoint to continue from")
    p.add_argument("--limit-steps", type=int, default=None, help="stop (with a checkpoint) after this many steps "
                   "in total, counting those before a resume; for smoke tests")
    p.add_argument("--evaluate", action="store_true", help="only evaluate (the --resume checkpoint) and exit")
    p.add_argument("--print-every", type=int, default=50, help="log the loss every N steps (0: epoch ends only)")
    return p.parse_args(argv)


def open_dataset(path):
    """A store made by `fastload pack` (a folder holding data.mdb) or an ImageFolder tree."""
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, "data.mdb")):
        return fl.LMDBDataset(path)
    return fl.FolderDataset(path)


def make_recipe(args, num_classes):
    """The recipe of --recipe with the sizes given on the command line."""
    sizes = {k: v for k, v in (("size", args.size), ("eval_size", args.val_size), ("eval_resize", args.val_resize))
             if v is not None}
    if args.recipe == "classic":
        size = sizes.get("size", 224)
        eval_size = sizes.get("eval_size", size)
        return recipes.classic(size, eval_size=eval_size, eval_resize=sizes.get("eval_resize", int(eval_size / 0.875)))
    if args.recipe == "torchvision_v2":
        return recipes.torchvision_v2(num_classes=num_classes, **sizes)
    if "size" in sizes:
        raise SystemExit("--size: the ffcv recipe's training size follows its ramp (160 px -> 192 px)")
    if "eval_resize" in sizes:
        raise SystemExit("--val-resize: the ffcv recipe resizes to --val-size / (224 / 256)")
    return recipes.ffcv_low_res(**sizes)


def setup_distributed(device_type):
    """(rank, world_size, device). Under torchrun (WORLD_SIZE set) joins the process group first."""
    if "WORLD_SIZE" not in os.environ:
        return 0, 1, torch.device(device_type)
    local_rank = int(os.environ["LOCAL_RANK"])
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def all_reduce_sum(t):
    if dist.is_initialized():
        dist.all_reduce(t)
    return t


def finish():
    if dist.is_initialized():
        dist.barrier()  # rank 0 may still be writing the last checkpoint
        dist.destroy_process_group()


def lr_factor(step, warmup_steps, total_steps):
    """Linear warm-up from ~0 to 1, then cosine decay to 0; per step, so a mid-epoch resume continues it exactly."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def save_checkpoint(path, model, optimizer, scheduler, train_loader, step, args):
    """Rank 0 writes everything a resume needs; written to a temporary file and renamed, never half-written."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "loader": train_loader.state_dict(), "step": step, "args": vars(args)}
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(model, loader, device):
    """Top-1 and top-5 accuracy over the whole evaluation set: each rank counts its own shard (pad=False: every
    image on exactly one rank), then the counts are summed over the ranks. Every rank evaluates rank 0's model,
    the one the checkpoint saves: BatchNorm's running statistics differ per rank after the last training step
    (DDP sends rank 0's at the start of each training forward, not after it)."""
    if dist.is_initialized():
        for buffer in model.buffers():
            dist.broadcast(buffer, 0)
    model.eval()
    counts = torch.zeros(3, dtype=torch.float64, device=device)  # top-1 hits, top-5 hits, images
    for x, y in loader:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == y[:, None]
        counts += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum(), torch.tensor(len(y), device=device)])
    top1, top5, n = all_reduce_sum(counts).tolist()
    model.train()
    return top1 / n, top5 / n


def main(argv=None):
    args = parse_args(argv)
    rank, world_size, device = setup_distributed(args.device)
    log = print if rank == 0 else (lambda *a, **k: None)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.backends.cudnn.benchmark = True
    threads = args.threads

    # --- data: FastLoader delivers normalised float batches on `device`, channels_last for the model -------
    train_ds = open_dataset(args.train)
    recipe = make_recipe(args, len(train_ds.classes))
    # MixUp/CutMix (torchvision_v2) make y [B, classes] soft targets, which CrossEntropyLoss takes as they are
    train_loader = fl.FastLoader(train_ds, batch_size=args.batch_size, shuffle=True, seed=args.seed,
                                 transform=recipe.train, device=device, channels_last=True, drop_last=True,
                                 threads=threads, decoder=args.decoder, **recipe.loader_kwargs)
    val_loader = None
    if args.val:
        val_ds = open_dataset(args.val)
        if val_ds.classes != train_ds.classes:
            raise SystemExit(f"{args.val} and {args.train} have different classes")
        # pad=False: under torchrun every image is evaluated exactly once (shards may differ by one image)
        val_loader = fl.FastLoader(val_ds, batch_size=args.batch_size, shuffle=False, pad=False,
                                   transform=recipe.eval, device=device, channels_last=True, threads=threads)
    if len(train_loader) == 0:  # drop_last: every rank's shard is smaller than one batch
        raise SystemExit(f"--batch-size {args.batch_size}: {args.train} gives each of {world_size} process(es) "
                         f"{len(train_loader.sampler)} images, not one full batch; use a smaller batch")
    log(f"train: {train_ds} -> {len(train_loader)} steps per epoch on each of {world_size} process(es), "
        f"recipe {args.recipe}: {recipe.train}")

    # --- model, optimiser, learning-rate schedule ------------------------------------------------------------
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = getattr(torchvision.models, args.arch)(num_classes=len(train_ds.classes))
    model = model.to(device, memory_format=torch.channels_last)
    ddp_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if on_gpu else None) \
        if dist.is_initialized() else model
    lr = args.lr if args.lr is not None else 0.1 * args.batch_size * world_size / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    total_steps = args.epochs * len(train_loader)
    warmup_steps = int(args.warmup_epochs * len(train_loader))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup_steps, total_steps))
    smoothing = recipe.label_smoothing if args.label_smoothing is None else args.label_smoothing
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=smoothing)  # the loss's job, not the loader's

    # --- resume: weights, optimiser, schedule and the loader's exact position ----------------------------
    step, start_epoch, resumed = 0, 0, False
    if args.resume:
        ckpt = torch.load(args.resume, map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt["model"])
    if args.resume and not args.evaluate:
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        train_loader.load_state_dict(ckpt["loader"])
        step, start_epoch, resumed = ckpt["step"], ckpt["loader"]["epoch"], True
        log(f"resumed from {args.resume}: step {step}, epoch {start_epoch}, "
            f"batch {ckpt['loader']['batches_done']} of {len(train_loader)}")

    def checkpoint():
        save_checkpoint(args.checkpoint, model, optimizer, scheduler, train_loader, step, args)
        log(f"checkpoint: {args.checkpoint} (step {step})")

    if args.evaluate:  # only evaluate the weights of --resume
        if val_loader is None or not args.resume:
            raise SystemExit("--evaluate needs --val and --resume (the checkpoint whose weights to evaluate)")
        top1, top5 = evaluate(model, val_loader, device)
        log(f"eval: top-1 {top1:.2%}, top-5 {top5:.2%} ({len(val_loader.dataset)} images)")
        finish()
        return model

    # --- training ------------------------------------------------------------------------------------------
    def limit_reached():
        return args.limit_steps is not None and step >= args.limit_steps

    for epoch in range(start_epoch, args.epochs):
        if limit_reached():
            break
        if not (resumed and epoch == start_epoch):  # set_epoch would restart a resumed epoch at its first batch
            train_loader.set_epoch(epoch)
        ddp_model.train()
        if recipe.size_schedule is not None and (epoch == start_epoch or recipe.size_schedule(epoch) !=
                                                 recipe.size_schedule(epoch - 1)):
            log(f"epoch {epoch}: training at {train_loader.size_of(epoch)} px")
        t, images, loss_sum, steps = time.perf_counter(), 0, torch.zeros((), device=device), 0
        for x, y in train_loader:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
                loss = criterion(ddp_model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step, steps, images = step + 1, steps + 1, images + len(y) * world_size
            loss_sum += loss.detach()  # no loss.item() every step: it would wait for the GPU each time
            if args.print_every and step % args.print_every == 0:
                log(f"epoch {epoch} step {step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.4f} "
                    f"{images / (time.perf_counter() - t):,.0f} img/s")
            if args.save_every and step % args.save_every == 0:
                checkpoint()
            if limit_reached():
                break
        if limit_reached():  # stopped mid-epoch: the checkpoint resumes with the next batch
            checkpoint()
            break
        trial = train_loader.stats().get("decoder_trial")  # --decoder auto: what it measured and chose
        log(f"epoch {epoch} done: mean loss {loss_sum.item() / max(1, steps):.4f}, "
            f"{images / (time.perf_counter() - t):,.0f} img/s" + (f"; decoder {train_loader.decoder}, measured "
                                                                 f"{trial['rates']} img/s" if trial else ""))
        if val_loader is not None:
            top1, top5 = evaluate(model, val_loader, device)
            log(f"epoch {epoch} eval: top-1 {top1:.2%}, top-5 {top5:.2%} ({len(val_loader.dataset)} images)")
        checkpoint()
    finish()
    return model


if __name__ == "__main__":
    main()
