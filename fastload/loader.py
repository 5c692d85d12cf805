"""FastLoader: ``for x, y in FastLoader(dataset)`` -> normalised [B, 3, H, W] batches on the device.

Producer threads (``workers``) take batch k = w, w + W, ... of the epoch: decode its crops natively into a reusable
slot (producer.py), and while it decodes, plan their next batches (PLAN_BATCHES at a time) and hand the previous
one over (on the CPU path, the affine/normalise stage; on CUDA, the copy and stage queued on a side stream). The
consumer takes batches in order (batch k from worker k % W), so results never depend on timing. On CUDA the
consumer ships each ragged batch to the GPU one batch ahead on a side stream (prefetch/pipe.py). When an epoch's
producers are on their last round, the next epoch's producers start (its batches are a pure function of seed and
epoch), so the training loop meets no empty pipeline between epochs.
"""
import atexit
import copy
import numbers
import os
import queue
import threading
import time
import weakref
import zlib

import numpy as np
import torch

from . import cuda_queues, decoders, ops
from .datasets.source import SubsetSource, as_source
from .producer import BatchMaker, Slot
from .sampler import ShardedSampler
from .stats import LoaderStats
from .transforms.pipeline import Pipeline
from .transforms.planners import RandomResizedCrop, _pair
from .transforms.planners import _Planner as _CropShorthand

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_POLL = 0.1  # seconds between checks of the stop flag while blocked on a queue

_live = weakref.WeakSet()  # every _Producers whose threads may run
_exiting = False  # set by _stop_all: the interpreter is exiting, the producers have had their wait


@atexit.register
def _stop_all():  # interpreter exit: no producer outlives it, even one whose iterator was never built
    global _exiting
    deadline = time.monotonic() + 5.0  # in all: producers left stuck by timeouts would each take it again
    for producers in list(_live):
        producers.close(timeout=max(0.0, deadline - time.monotonic()))
    # A producer still in a native op now (a long decode or CPU stage) stays there once the finalisation begins
    # (native/exit_guard.h); a close() from a __del__ run by the finalisation does not wait for it again.
    _exiting = True


def _forget_inherited():
    """os.fork's child: the parent's producer threads do not exist here, so nothing of theirs is waited for (a
    close() or the exit would wait its full timeout on them); an iterator inherited from the parent ends, and a new
    iteration in the child starts producers of its own."""
    for producers in list(_live):
        producers.forget()
    _live.clear()


os.register_at_fork(after_in_child=_forget_inherited)


class FastLoader:
    """Batches of crops from a FolderDataset or LMDBDataset, decoded only where the crop is.

    Args:
        dataset: FolderDataset, LMDBDataset, a Subset/random_split of them, or any object implementing the dataset
            protocol (README, "Custom datasets: the dataset protocol"; fastload/datasets/source.py).
        batch_size, shuffle, seed, drop_last: as in DataLoader; per-sample randomness is a pure function of
            (seed, epoch, sample index), so the same seed gives the same batches whatever the thread count.
        transform: a ``fastload.transforms.Compose([...])``, torchvision.transforms.v2's vocabulary: geometry
            (RandomResizedCrop, Resize, CenterCrop, flips, RandomAffine, RandomRotation) planned before decoding and
            folded into one warp, photometric ops and policies (ColorJitter, TrivialAugmentWide, RandAugment,
            AutoAugment, ...) per sample in the stage, ToDtype + Normalize, RandomErasing, and MixUp/CutMix last
            (then y is [B, num_classes] float). It replaces crop/flip/mean/std/dtype, a shorthand for
            ``Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToDtype(torch.float32, scale=True),
            Normalize(mean, std)])`` (same meaning; the shorthand keeps its own random draws). A transform fastload
            cannot run is refused here, with the list of those it can.
        crop: a planner, ``RandomResizedCrop(224)`` (default) or ``CenterCrop(224)`` for evaluation.
        flip: horizontal flip probability; replaces the crop's own (on a copy: the crop passed is not changed).
        mean, std: per-channel, on the 0-1 scale, applied as ``(x / 255 - mean) / std``; ``None`` for both gives
            x / 255. Values over 1 (a 0-255 scale, e.g. mean=(123.7, 116.3, 103.5)) are refused.
        dtype: torch.float32, torch.float16 or torch.bfloat16 (normalised), or torch.uint8: the resized pixels as
            they are, 0-255, not normalised (mean/std must then be left at their defaults or None).
        channels_last: output memory format.
        device: "cpu" (default) or "cuda[:n]"; "cuda" without an index means cuda:LOCAL_RANK under torchrun.
        threads: native decode threads per batch (default: the CPU cores, divided by LOCAL_WORLD_SIZE under
            torchrun, then among the producers, which decode at once: one decode thread per core in all. They run at
            nice +5 so the training loop's own thread keeps a core when all are busy).
        workers: producer threads, each with a batch in flight (default 2; 5 with decoder="hybrid"). More
            producers overlap more Python work with decoding, but take the GIL from the training thread more
            often: on CUDA four fed an eager ResNet-50 less than two (bench/RESULTS.md). While its batch decodes, each
            plans its next batches' crops and per-sample parameters and hands its previous batch over.
        cpus: the CPU cores (ids, as ``os.sched_getaffinity`` lists them) the producers and their decode threads
            may run on, e.g. ``set(range(2, 16))`` to leave cores 0-1 to the training loop's thread and autograd's
            (Linux); the default thread counts then follow its size. Default None: wherever the OS puts them.
        prefetch: batches each producer keeps ready.
        rank, world_size: shard of the data (default: torch.distributed's when initialised). Shards are
            disjoint and equally long (padded by wrapping around, or cut with drop_last) so DDP never waits on
            a rank with fewer batches; ``pad=False`` (evaluation) gives every sample exactly once over all
            ranks, shards differing by at most one sample: all_reduce (correct, count) sums for exact metrics.
        pad: True (default) pads the shards to equal length; False for evaluation (see rank, world_size).
        strict: True (default) refuses a JPEG whose libjpeg warnings mean the pixels may be wrong (DecodeError,
            or skipped with on_error="skip"); False lets every warning through (fastload.ops.decode_crop explains
            which warnings are which).
        max_pixels: the largest image (width x height) decoded, a positive int; a header, or the dataset's
            heights/widths, claiming more is that sample's DecodeError, so that no file or index makes the loader
            allocate without bound (default: Pillow's limit).
        decoder: "cpu" (default): libjpeg-turbo decodes only the crop, DCT-downscaled, on ``threads`` cores: the
            same pixels on every device. "nvjpeg" (CUDA): the GPU's hardware JPEG decoder (A100, A30, H100,
            H200) decodes the batch's baseline YCbCr JPEGs, crops at full resolution (the kernel does all the
            resizing), and the cores any other kind (progressive, CMYK, grayscale, 4:1:1); its pixels are close
            to, not equal to, the CPU decoder's (nvJPEG's IDCT and chroma upsampling). The engines report success
            on damaged data, so a JPEG reaches them only after a strict CPU entropy check (once per sample for the
            loader's life; the first epoch pays it on the cores): one that fails is decoded by the cores, and
            ``strict``/``on_error`` hold exactly as with "cpu" (same DecodeError, same skipped samples). A
            batch where nvJPEG itself fails is decoded whole by the cores. Alone it delivers more batches per second than 16
            cores; inside a training loop about as many (it needs the 32 hardware queues fastload asks CUDA for at
            import, and warns without: fastload/cuda_queues.py): measure before using it.
            "hybrid" (CUDA): both at once on different batches: the cores decode every fifth batch of an epoch
            (batch k with k % 5 == 4, as decoder="cpu" would) and the hardware decoder the others (as
            decoder="nvjpeg" would); which decoder made a batch depends on its index alone, never on timing.
            "auto": measures, inside the loop that iterates the loader, which decoder feeds it fastest. Where the
            device has JPEG engines, after the loop's first 32 batches (its start is slow whatever the decoder) the
            next ~120 are made by each decoder in turn (40 each: 8 to settle, then 32 timed from the loop taking one
            batch to taking the next; an interval over 10x the mean of the others, a recompile or a checkpoint save,
            is left out), starting with the rule (the cores where the process has 12 or more to decode on, per GPU
            under torchrun, else the engines: the crossover measured inside ResNet-18 and ResNet-50 training on an
            H200 with 4-16 cores, bench/RESULTS.md, 'decoder="auto"'), and the fastest keeps going (another beats
            the rule only by more than 5%). Without engines (or on the CPU) "auto" is "cpu". ``stats()["decoder"]``
            says which decoder runs, ``stats()["decoder_trial"]`` the img/s measured and the choice; ``state_dict``
            keeps the choice, so a resumed run does not measure again. Each batch is exactly the batch of the
            decoder that made it, but which one that is depends on the measurement: name a decoder where runs must
            give equal pixels. ``workers``/``threads``, when given, apply to every decoder tried. Under torchrun
            each process measures and chooses for itself.
        on_error: "raise" (DecodeError naming the sample) or "skip" (deterministic replacement, counted).
        timeout: seconds the training loop waits for one batch before a TimeoutError (a read stuck in the kernel,
            e.g. on a hung network file system, cannot be interrupted; this turns it into an error). None: no limit.
        repeats: repeated augmentation (torchvision's RASampler, ``--ra-sampler --ra-reps``): each sample comes
            ``repeats`` times per epoch, its copies spread over the ranks (in a row on one rank), each copy with its
            own crop and random draws (drawn with the key index + copy * len(dataset): copy 0 draws what it would
            without repeats); the epoch keeps its length (len(loader) as without repeats), so it covers about
            1/repeats of the dataset. See ShardedSampler.
        size_schedule: ``callable(epoch) -> int or (h, w)``: the output size of each epoch (a resolution schedule,
            e.g. ``fastload.recipes.linear_ramp``); the crops, DCT downscale and stage follow it. Without it,
            ``set_size`` changes the size between epochs. The pipeline's size (its RandomResizedCrop/Resize/
            CenterCrop, or the crop planner's) is what a schedule replaces; earlier size-carrying steps scale with it
            (Resize(256) + CenterCrop(224) at 192: Resize(219) + CenterCrop(192)).
    """

    def __init__(self, dataset, batch_size=256, shuffle=True, seed=0, crop=None, flip=None, mean=IMAGENET_MEAN,
                 std=IMAGENET_STD, dtype=torch.float32, channels_last=False, device="cpu", threads=None,
                 prefetch=2, drop_last=False, rank=None, world_size=None, on_error="raise", workers=None, pad=True, timeout=None,
                 strict=True, max_pixels=ops.MAX_PIXELS, decoder="cpu", transform=None, repeats=1, size_schedule=None,
                 cpus=None):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        dtype = _check_dtype(dtype)
        self.mean, self.std, self._in_scale = _normalisation(mean, std, dtype)
        self.device = _resolve_device(device)
        self.cpus = _check_cpus(cpus)
        # Under torchrun the processes of one machine share its cores.
        cores = len(self.cpus) if self.cpus is not None else \
            max(1, usable_cores() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
        kind = decoders.resolve(decoder, self.device, cores)  # its worker and thread defaults: decoders.KINDS
        self._trial = decoders.trial(decoder, kind, self.device)  # decoder="auto" with engines: measured choice
        for name, value in (("batch_size", batch_size), ("prefetch", prefetch), ("workers", workers),
                            ("max_pixels", max_pixels)):
            if value is not None or name != "workers":
                _check_positive_int(name, value)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        # Python ints: a numpy scalar in state_dict() would make torch.load (weights_only) refuse the checkpoint
        seed, batch_size = int(seed), int(batch_size)
        self._layout = (cores, workers, threads)  # what _use_decoder derives a kind's workers and threads from
        dataset = as_source(dataset)  # a Subset becomes a view; what FastLoader cannot read is refused here
        if len(dataset) == 0:
            raise ValueError("the dataset is empty")
        self.dataset = dataset
        self.batch_size = batch_size
        if transform is None:
            self.crop = _with_flip(crop if crop is not None else RandomResizedCrop(224), flip)
            self.pipeline = Pipeline.shorthand(self.crop, self.mean, self.std, self._in_scale, dtype)
        else:
            _check_no_shorthand(crop, flip, mean, std, dtype)
            self.crop = None
            self.pipeline = Pipeline.build(transform)
            dtype = self.pipeline.dtype
        self.dtype = dtype
        self.channels_last = channels_last
        self.prefetch = prefetch
        self.drop_last = drop_last
        self.on_error = on_error
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout}")
        self.timeout = timeout
        self.sampler = ShardedSampler(len(dataset), shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                                      drop_last=drop_last, pad=pad, repeats=repeats)
        # The DDP habit `loader.sampler.set_epoch(epoch)` selects the loader's epoch, as set_epoch does.
        self.sampler.on_set_epoch = weakref.WeakMethod(self.set_epoch)
        self.seed = seed
        self._stats = LoaderStats()
        self._fingerprint = None  # _dataset_fingerprint's, computed once
        # Repeated augmentation: the sampler hands out keys (index + copy * n); the producers read a view in which
        # key k is sample k % n, and draw every random parameter with the key, so each copy is augmented its way.
        source = dataset if self.sampler.repeats == 1 else _repeated(dataset, self.sampler.repeats)
        self._maker = BatchMaker(source, self.pipeline, seed, self._decoder_layout(kind)[1], on_error, strict,
                                 max_pixels, self._stats, device=self.device, decoder=kind,
                                 ranks=(self.sampler.rank, self.sampler.world_size))
        self._use_decoder(kind)  # the loader's decoder, workers and threads
        if size_schedule is not None and not callable(size_schedule):
            raise TypeError(f"size_schedule must be a callable(epoch) -> int or (h, w), got {size_schedule!r}")
        self.size_schedule = size_schedule
        self._size = self.pipeline.out_size  # set_size's: the size of the epochs started from now on
        self._size_set = False  # whether set_size (or a state made after one) chose it
        self._size_for(0)  # a schedule that cannot give a size fails here, not in the training loop
        if kind.name != "cpu" or self._trial is not None:  # once the arguments are known good
            cuda_queues.warn_if_few()  # the engines would queue behind the model's kernels
        self._running = (None, None)  # (epoch, size) of the latest epoch iterated
        self._resume_size = None  # the size of the epoch load_state_dict resumes mid-way
        self._epoch = 0
        self._start_batch = 0  # where the next iteration starts (set by load_state_dict, or by close())
        self._paused = None  # weakref to the iterator close() paused, while the position it left in _start_batch stands
        self._batches_done = 0
        self._epoch_set = False
        self._iterator = None
        # Whether the latest iterator's batches still move the position: set_epoch (another epoch) or
        # load_state_dict since it started chose the next iteration's, and it goes on without moving it.
        self._iterator_counts = False
        self._after_epoch = None  # a loaded state's "after_epoch": set_epoch(it) resumes at that epoch's end
        self._finished_epoch = False
        self._pipe = None
        self._ahead = None  # the next epoch's iterator, started early (_start_next_epoch)
        self._next_decoder = None  # load_state_dict's decoder="auto" choice, for the next iteration

    def _decoder_layout(self, kind):
        """(workers, threads) for ``kind``: the ones passed to the loader, else the kind's defaults."""
        cores, workers, threads = self._layout
        workers = workers or kind.workers(cores, self.device.type == "cuda")
        return workers, threads or kind.threads(cores, workers, self.device.type == "cuda")

    def _switch_to_next_decoder(self):
        """Applies load_state_dict's decoder="auto" choice once no iterator of this loader runs."""
        if self._next_decoder is None:
            return
        if self._next_decoder != self.decoder:
            if self._ahead is not None:  # started with the decoder being replaced
                self._ahead.close()
                self._ahead = None
            self._use_decoder(decoders.KINDS[self._next_decoder])
        self._next_decoder = None

    def _use_decoder(self, kind):
        """Producers started from now on decode with ``kind`` (none may be running)."""
        self.decoder = kind.name
        self.workers, self.threads = self._decoder_layout(kind)
        self._maker.use(kind, self.threads)

    # --- epoch bookkeeping -------------------------------------------------------------------------------
    def set_epoch(self, epoch):
        """Selects the epoch the next iteration runs (its shuffle and crops), from its first batch (``loader.sampler.
        set_epoch`` does the same). Without calls, epochs count up. The epoch an iteration is running now changes
        nothing (a loop may call it every step); another one leaves the running iteration to finish its own epoch
        without moving the position that state_dict saves."""
        epoch = int(epoch)
        running = self._counting_iterator()
        paused = self._paused is not None and self._paused() is running  # by close(): it goes on if asked
        if running is not None and running.epoch == epoch and (not running.producers.stop.is_set() or paused):
            return
        if self._start_batch and epoch == self._epoch:
            self._epoch_set = True  # the epoch a resumed state is in: keep its position (DDP habit)
            return
        resumed_after = self._after_epoch is not None and epoch == self._after_epoch and self._epoch == epoch + 1 \
            and self._epoch_set and not self._batches_done
        self._epoch = epoch
        self.sampler.follow(self._epoch)
        self._epoch_set = True
        # A state saved on an epoch's last batch resumes at the next epoch; set_epoch of the epoch it was saved in
        # (the loop's own counter) keeps that position: this epoch then has no batches left.
        self._start_batch = self._batches_done = len(self) if resumed_after else 0
        self._after_epoch = None
        self._paused = None
        self._iterator_counts = False

    def _counting_iterator(self):
        """The latest iterator while its batches move the position, else None."""
        current = self._iterator() if self._iterator is not None and self._iterator_counts else None
        return current if current is not None and current.producers is not None else None

    def set_size(self, size):
        """The output size (int or (h, w)) of the epochs started from now on (the next ``iter(loader)``; an epoch
        in progress keeps its size): a resolution schedule step by step, between epochs. Crops, DCT downscale and
        the stage follow it; batch buffers grow as needed. state_dict records it. With size_schedule=, the
        schedule decides instead."""
        if self.size_schedule is not None:
            raise ValueError("this loader has a size_schedule, which sets every epoch's size: change the schedule, "
                             "or build the loader without one to call set_size")
        self._size, self._size_set = _pair(size, "size"), True

    def size_of(self, epoch):
        """(h, w) of the batches of ``epoch`` as things stand (the schedule's, or set_size's)."""
        return self._size_for(epoch)

    def _size_for(self, epoch):
        if self.size_schedule is None:
            return self._size
        size = self.size_schedule(epoch)
        try:
            return _pair(size, "size")
        except (TypeError, ValueError) as e:
            raise ValueError(f"size_schedule({epoch}) returned {size!r}: {e}") from None

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def state_dict(self):
        """Position to resume from: the batches after the last one this loader handed out (where the next
        ``iter(loader)`` starts, in this process or another)."""
        epoch, done = self._epoch, self._batches_done
        after = None
        if self._epoch_done() and not self._epoch_set:  # a finished epoch resumes at the next one
            after, epoch, done = epoch, epoch + 1, 0
        sampler = self.sampler._state_dict(consumed=min(done * self.batch_size, len(self.sampler)))
        sampler["epoch"] = epoch
        # the size of the epoch it resumes in (mid-epoch: the one that epoch started with), and set_size's
        size = self._running[1] if done and self._running[0] == epoch else self._size_for(epoch)
        state = {"epoch": epoch, "batches_done": done, "seed": self.seed, "batch_size": self.batch_size,
                 "sampler": sampler, "size": list(size)}
        if after is not None:  # saved on that epoch's last batch: set_epoch(after) on resume keeps the position
            state["after_epoch"] = after
        # set_size's choice travels with the state; a loader's own size is its configuration (checked on load)
        state["size_chosen"] = self._size_set
        if self._size_set:
            state["next_size"] = list(self._size)
        if self._trial is not None and self._trial.chosen is not None:
            state["decoder"] = self._trial.chosen  # decoder="auto" resumes with its choice
        state["dataset"] = self._dataset_fingerprint()
        return state

    def _dataset_fingerprint(self):
        """CRC-32 of the samples' sizes and labels, in order: a state resumes only the dataset it was made on
        (another one of the same length would take other samples at the saved position without a word)."""
        if self._fingerprint is None:
            crc = 0
            for array in (self.dataset.heights, self.dataset.widths, self.dataset.labels):
                crc = zlib.crc32(np.ascontiguousarray(array).tobytes(), crc)
            self._fingerprint = crc
        return self._fingerprint

    def load_state_dict(self, state):
        missing = [k for k in ("epoch", "batches_done", "seed", "batch_size", "sampler") if k not in state]
        if missing:
            raise ValueError(f"not a FastLoader state_dict: it lacks {', '.join(map(repr, missing))} (pass what "
                             f"FastLoader.state_dict() returned)")
        if state["seed"] != self.seed or state["batch_size"] != self.batch_size:
            raise ValueError(f"state is for seed={state['seed']}, batch_size={state['batch_size']}; this loader has "
                             f"seed={self.seed}, batch_size={self.batch_size}")
        if "dataset" in state and state["dataset"] != self._dataset_fingerprint():  # states before it: unchecked
            raise ValueError(f"state is for another dataset: the sizes or labels of its {len(self.dataset)} samples "
                             f"differ from this loader's (a different folder, store, order or subset)")
        choice = state.get("decoder") if self._trial is not None else None  # decoder="auto"'s earlier choice
        if choice is not None:
            self._trial.check(choice)
        # Another world size or sampler setting first: it also changes how many batches an epoch has, which the
        # check after it would otherwise name as the reason.
        self.sampler._check_state(state["sampler"])
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        if not 0 <= done <= len(self):
            raise ValueError(f"state has batches_done={done}; an epoch of this loader has {len(self)} batches")
        size = tuple(state.get("size", self.pipeline.out_size))  # states from before resolution schedules
        if self.size_schedule is not None and self._size_for(epoch) != size:
            raise ValueError(f"state is for size {size} at epoch {epoch}; this loader's size_schedule gives "
                             f"{self._size_for(epoch)}")
        # Was the saved size chosen by set_size? States before "size_chosen" always carried next_size: one equal to
        # the running size may have been the loader's configuration, so it is checked as one.
        chosen = state.get("size_chosen", "next_size" in state and tuple(state["next_size"]) != size)
        if self.size_schedule is None and not chosen and size != self._size:
            raise ValueError(f"state is for size {size}; this loader makes {self._size}: build it with the size the "
                             f"checkpoint's loader had (or call set_size({size}) before loading, then set_size "
                             f"again for the epochs after)")
        self.sampler._load_state_dict(state["sampler"])
        self.sampler.follow(epoch)  # the loader holds the position; its sampler lists the whole epoch
        if self.size_schedule is None and chosen:
            self._size, self._size_set = tuple(state["next_size"]), True
        self._resume_size = size if done else None
        self._epoch = epoch
        self._start_batch = self._batches_done = done
        self._epoch_set = True
        self._finished_epoch = False
        self._paused = None
        self._iterator_counts = False  # a running iteration goes on, without moving the loaded position
        after = state.get("after_epoch")
        self._after_epoch = int(after) if after is not None and int(after) == epoch - 1 and not done else None
        if choice is not None:  # no trial; the next iteration decodes with it (a running one keeps its decoder)
            self._trial.adopt(choice)
            self._next_decoder = choice
            current = self._iterator() if self._iterator is not None else None
            if current is None or not current.live():
                self._switch_to_next_decoder()

    def close(self):
        """Stops the producer threads now: the epoch's and those of the next epoch, which start while an epoch
        ends. Nothing is lost: a loop over the loader that goes on after it continues with the next batch (new
        producers start there), and so does a new ``iter(loader)`` mid-epoch, as state_dict says. Call it before
        forking worker processes (a torch DataLoader for another dataset), so no producer is mid-decode at the
        fork, or to free the buffers at once (its own, and the process's pool of CPU batch outputs that no batch
        holds, up to 1 GiB kept for reuse, oldest first out); dropping the loader frees its own when the garbage
        collector gets to it."""
        self._stop()
        ops.C.release_cpu_outputs()  # the host pool of CPU batch outputs (warp_cpu.cpp): blocks no batch holds

    def _stop(self):
        """close() without freeing the pool of CPU batch outputs: the benchmarks' clock starts from nothing made
        ahead, as a training loop's epochs do not start from an empty pool."""
        current = self._iterator() if self._iterator is not None else None
        already_paused = current is not None and current.paused and self._paused is not None \
            and self._paused() is current
        if current is not None and not already_paused:  # a second close() leaves the first one's pause as it is
            # Paused only while the loader's position is still that iterator's: set_epoch or load_state_dict
            # since it ran chose another one, which stands.
            if current.live() and self._counting_iterator() is current:
                current.pause()
                # a new iter() resumes here, as after load_state_dict (the paused iterator takes it back if it
                # goes on instead)
                self._start_batch, self._resume_size = current.next_batch, current.size
                self._paused = weakref.ref(current)
            else:
                current.close()
        if self._ahead is not None:
            self._ahead.close()
        self._ahead = None

    def __reduce__(self):
        raise TypeError("a FastLoader cannot be pickled (it runs threads and holds native buffers): build it in the "
                        "process that iterates it, from its dataset (which pickles), and carry its state_dict() to "
                        "resume where another left off")

    def stats(self):
        """Throughput and where time went: images/s, seconds in read / decode / stage / waiting, counts, and
        ``decoder``: the decoder making batches now; with decoder="auto" on a GPU with JPEG engines,
        ``decoder_trial``: {"rates": img/s the loop took batches at with each decoder measured so far,
        "chosen": the decoder kept, None while measuring}."""
        summary = dict(self._stats.summary(), decoder=self.decoder)
        if self._trial is not None:
            summary["decoder_trial"] = self._trial.summary()
        return summary

    # --- iteration ---------------------------------------------------------------------------------------
    def _epoch_done(self):
        """Whether the latest iteration handed out its epoch's last batch (with or without its StopIteration)."""
        return self._finished_epoch or (self._running[0] == self._epoch and 0 < len(self) <= self._batches_done)

    def __iter__(self):
        """The batches from the loader's position: where the last iteration stopped (a break, an exception, a
        second iter()), as state_dict says; the next epoch once one is finished; set_epoch's or load_state_dict's
        choice. One iteration runs at a time: an earlier iterator still going raises if used again."""
        self.sampler.check_world()
        self._stats.start()  # images/s counts from the first iteration's start, its first batch's wait included
        previous = self._iterator() if self._iterator is not None else None
        if previous is not None:
            previous.retire()
        self._switch_to_next_decoder()
        if not self._epoch_set:
            if self._epoch_done():
                self._epoch += 1
            elif self._batches_done and not self._start_batch and self._running[0] == self._epoch:
                # Stopped mid-epoch: go on after the last batch handed out. Starting the epoch over would give a
                # loop that breaks after N steps the same N batches every time.
                self._start_batch, self._resume_size = self._batches_done, self._running[1]
        self._epoch_set = self._finished_epoch = False
        self._after_epoch = None
        start, self._start_batch, self._paused = self._start_batch, 0, None
        self._batches_done = start
        size = self._resume_size if start and self._resume_size else self._size_for(self._epoch)
        self._resume_size = None
        self._running = (self._epoch, size)
        self.sampler.follow(self._epoch)  # list(loader.sampler) gives this epoch's indices
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.epoch == self._epoch and start == 0 and ahead.size == size \
                and not ahead.producers.stop.is_set():
            iterator = ahead  # its producers have been decoding this epoch's first batches since the last one ended
        else:
            if ahead is not None:  # set_epoch, load_state_dict or set_size chose another start or size
                ahead.close()
            iterator = self._iterator_for(self._epoch, self._epoch_batches(self._epoch), start, size)
        self._iterator = weakref.ref(iterator)  # a weak ref: dropping the iterator stops its threads
        self._iterator_counts = True
        return iterator

    def _iterator_for(self, epoch, batches, start, size):
        self.pipeline.set_epoch_size(epoch, size)  # before its producers plan anything
        iterator = _EpochIterator(self, batches, start, epoch)
        iterator.size = size
        return iterator

    def _epoch_batches(self, epoch):
        indices = self.sampler.epoch_keys(epoch)  # with repeats, keys into the repeated view (_repeated)
        batches = [indices[i:i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def _start_next_epoch(self, epoch):
        """Starts the producers of ``epoch`` (the one that follows, unless set_epoch says otherwise) as soon as
        the current epoch's last batch is produced, so the training loop meets no empty pipeline at the epoch
        boundary. __iter__ adopts them, or stops them when another epoch or start was chosen."""
        if self._ahead is None:
            batches = self._epoch_batches(epoch)
            if batches:
                self._ahead = self._iterator_for(epoch, batches, 0, self._size_for(epoch))

    def _stage_cpu(self):
        """The CPU stage as a function of the batch alone: producer threads hold it, and must not hold the loader
        (a loader that is dropped stops its threads, including those of an epoch started ahead)."""
        pipeline, channels_last, stats = self.pipeline, self.channels_last, self._stats

        def stage(batch):
            """(x, y): the stage, then the batch ops (MixUp/CutMix) with the parameters the producer drew."""
            t = time.perf_counter()
            x = pipeline.run(batch.data, batch.offsets, batch.shapes, batch.matrices, batch.params,
                             channels_last=channels_last)
            if batch.batch_plan is not None:  # the labels came mixed from the producer
                x = pipeline.mix_images(x, batch.batch_plan, batch.params)
            stats.add(stage=time.perf_counter() - t)
            return x, batch.labels
        return stage

    def _device_pipe(self):
        if self._pipe is None:  # one persistent side stream per loader; the same stage as the CPU's
            from .prefetch.pipe import DevicePipe
            self._pipe = DevicePipe(self.device, self.pipeline.out_size, self.mean, self.std, self.dtype,
                                    self.channels_last, in_scale=self._in_scale, stage=self.pipeline.run,
                                    batch_ops=self.pipeline.mix_images)
        return self._pipe


_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)


def _repeated(source, repeats):
    """The source seen ``repeats`` times over: key k reads sample k % len(source) (index arrays tiled, reads and
    names mapped through), so the producers can key each copy's random draws by k."""
    base, indices = (source.base, source.indices) if isinstance(source, SubsetSource) else \
        (source, np.arange(len(source), dtype=np.int64))
    return SubsetSource(base, np.tile(indices, repeats))


def _check_dtype(dtype):
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
        raise TypeError(f"dtype must be a torch dtype: pass torch.{name}, not the string {dtype!r}")
    if not isinstance(dtype, torch.dtype) or dtype not in _DTYPES:
        raise ValueError(f"dtype must be torch.float32, torch.float16, torch.bfloat16 or torch.uint8, got {dtype!r}")
    return dtype


def _per_channel(name, values):
    """A tuple of floats (1 or 3 of them) or None."""
    if values is None:
        return None
    values = (values,) if isinstance(values, (int, float)) else values
    try:
        values = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number or 3 numbers (per channel), got {values!r}") from None
    if len(values) not in (1, 3):
        raise ValueError(f"{name} needs 1 or 3 values (per channel), got {len(values)}: {values}")
    return values


def _normalisation(mean, std, dtype):
    """(mean, std, in_scale) for the stage: ``(x * in_scale - mean) / std``. uint8 output is the resized pixels
    as they are (0-255): normalising and then rounding to integers would leave values -2..3."""
    mean, std = _per_channel("mean", mean), _per_channel("std", std)
    if dtype == torch.uint8:
        if (mean, std) not in ((IMAGENET_MEAN, IMAGENET_STD), (None, None)):
            raise ValueError(f"dtype=torch.uint8 gives the resized pixels as they are (0-255), not normalised: "
                             f"mean/std are not applied (got mean={mean}, std={std}); leave them at their defaults "
                             f"or pass None")
        return None, None, 1.0
    if std is not None and min(std) <= 0:
        raise ValueError(f"std must be positive, got {std}")
    if (mean is not None and max(mean) > 1) or (std is not None and max(std) > 1):
        raise ValueError(f"mean/std are on the 0-1 scale, applied as (x / 255 - mean) / std; got mean={mean}, "
                         f"std={std}: divide 0-255 values by 255 (ImageNet: mean={IMAGENET_MEAN}, std={IMAGENET_STD})")
    return mean, std, 1.0 / 255


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_no_shorthand(crop, flip, mean, std, dtype):
    """transform= says everything crop/flip/mean/std/dtype would: one way to say each thing."""
    given = [name for name, value, default in (("crop", crop, None), ("flip", flip, None), ("mean", mean, IMAGENET_MEAN),
                                               ("std", std, IMAGENET_STD), ("dtype", dtype, torch.float32))
             if value is not default and value != default]
    if given:
        raise ValueError(f"transform= replaces {', '.join(given)}: put them in the pipeline (RandomResizedCrop/"
                         f"CenterCrop, RandomHorizontalFlip, ToDtype, Normalize) instead of passing both")


def _with_flip(crop, flip):
    """The crop with flip probability ``flip``: a copy, so a crop shared with other loaders keeps its own."""
    if not isinstance(crop, _CropShorthand):
        raise TypeError(f"crop= takes the shorthand fastload.RandomResizedCrop or fastload.CenterCrop, got {crop!r}; "
                        f"fastload.transforms' classes (torchvision's) go in transform=T.Compose([...])")
    if flip is None:
        return crop
    if isinstance(flip, bool) or not isinstance(flip, numbers.Real) or not 0.0 <= flip <= 1.0:
        raise ValueError(f"flip must be a probability between 0 and 1, got {flip!r}")
    crop = copy.copy(crop)
    crop.flip = float(flip)
    return crop


def _resolve_device(device):
    if isinstance(device, str) and device.split(":")[0].strip().lower() == "gpu":
        raise ValueError(f"device={device!r} is not a torch device: use 'cuda' (or 'cuda:N')")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu' or 'cuda[:n]', got {device!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' but CUDA is not available; use device='cpu'")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
    elif device.type != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device}")
    return device


def _check_cpus(cpus):
    if cpus is None:
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("cpus= needs os.sched_setaffinity (Linux)")
    try:
        cpus = {int(c) for c in cpus}
    except (TypeError, ValueError):
        raise TypeError(f"cpus must be a collection of CPU core ids, got {cpus!r}") from None
    available = os.sched_getaffinity(0)
    if not cpus or not cpus <= available:
        raise ValueError(f"cpus must be a non-empty subset of the cores this process may use "
                         f"({sorted(available)}), got {sorted(cpus)}")
    return cpus


def usable_cores():
    """The cores this process may run on: its CPU affinity (a SLURM or container cpuset, taskset), not the
    machine's count, which os.cpu_count() gives."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def _enter_thread(cpus, device):
    """A producer's thread setup."""
    if cpus is not None:  # this thread, and the decode threads it starts (they inherit the mask)
        os.sched_setaffinity(0, cpus)
    if device.type == "cuda":  # pinned allocations belong to this rank's GPU, not GPU 0
        torch.cuda.set_device(device)


# Batches a producer prepares in one pass (BatchMaker.prepare_many): its next ones. Planning four batches together
# costs about half the Python (and GIL) time per batch of planning each alone (0.37-0.53x over the bench specs), and
# the training thread waits for that GIL (bench/RESULTS.md, "Planning several batches at once").
PLAN_BATCHES = 4


class _Plans:
    """A producer's plans (BatchMaker.prepare) for its batches k, k + stride, ...: made in the producer's own
    thread while its previous batch decodes (``ahead``), the first alone (nothing decodes yet), then PLAN_BATCHES
    at a time. A batch whose planning failed raises when it is asked for (``get``), in its turn."""

    def __init__(self, maker, batches, epoch, stride):
        self.maker, self.batches, self.epoch, self.stride = maker, batches, epoch, stride
        self.ready, self.failed, self.many = {}, {}, 1  # k -> Prepared / exception; batches the next pass plans

    def ahead(self, k):
        if k in self.ready or k in self.failed or k >= len(self.batches):
            return
        ks = range(k, min(len(self.batches), k + self.stride * self.many), self.stride)
        self.many = PLAN_BATCHES
        try:  # prepare_many stops at the first batch that fails, or raises where that is the first
            self.ready = dict(zip(ks, self.maker.prepare_many([self.batches[j] for j in ks], self.epoch, ks)))
        except Exception as e:
            self.failed[k] = e

    def get(self, k):
        self.ahead(k)
        if k in self.failed:
            raise self.failed.pop(k)
        return self.ready.pop(k)


class _Producers:
    """What the producer threads share with the consumer. Threads hold this, never the iterator, so dropping
    the iterator (a ``break``, ``del``, an exception) garbage-collects it and its __del__ stops them."""

    def __init__(self, loader, batches, start, epoch):
        self.maker = loader._maker
        self.device = loader.device
        self.stage = loader._stage_cpu() if loader.device.type == "cpu" else None
        # CUDA: each producer queues its batch's copy + stage on the side stream itself, so the training
        # thread only waits on an event (it launches the model's kernels; bench/RESULTS.md, "Issue 18").
        self.pipe = loader._device_pipe() if loader.device.type == "cuda" else None
        self.stats = loader._stats
        self.cpus = loader.cpus
        self.epoch = epoch
        self.batches = batches
        self.stop = threading.Event()
        on_gpu = loader.device.type == "cuda"
        n = min(loader.workers, max(1, len(batches) - start))
        self.queues = [queue.Queue(maxsize=loader.prefetch) for _ in range(n)]
        # Slots per producer: one being filled, plus (GPU) one being handed over while the next decodes (produce)
        # and the ones queued or still being copied.
        nslots = loader.prefetch + 2 if on_gpu else 1
        self.free = [queue.Queue() for _ in range(n)]
        for f in self.free:
            for _ in range(nslots):
                f.put(Slot(pin=on_gpu))
        self.threads = [threading.Thread(target=self.run, args=(w, start), daemon=True, name=f"fastload-{w}")
                        for w in range(n)]
        # Threads inside run(). A Ctrl-C can cut Thread.start() short after the thread began but before it counts
        # as alive; registering here (before looking at `stop`) lets close() wait for those too.
        self.running = set()
        self.changed = threading.Condition()
        _live.add(self)
        try:
            for t in self.threads:
                t.start()
        except BaseException:  # e.g. Ctrl-C between two starts: stop those already running
            self.close()
            raise

    def put(self, q, item):
        while not self.stop.is_set():
            try:
                q.put(item, timeout=_POLL)
                return True
            except queue.Full:
                pass
        return False

    def take(self, q):
        while not self.stop.is_set():
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                pass
        return None

    def run(self, w, start):
        with self.changed:
            self.running.add(threading.current_thread())
        try:
            if not self.stop.is_set():
                self.produce(w, start)
        finally:
            with self.changed:
                self.running.discard(threading.current_thread())
                self.changed.notify_all()

    def produce(self, w, start):
        """Makes this producer's batches in a pipeline of its own: while batch k decodes (the cores' native threads,
        GIL released), the producer plans its next batches, and on CUDA, while batch k + n decodes, it hands batch
        k over (the copy and stage queued on the GPU). So one Python thread keeps its decode threads busy, with no
        thread of its own for planning (fewer Python threads take the GIL from the training thread,
        bench/RESULTS.md, "One Python thread per producer"). On the CPU the hand-over is the stage, itself work
        for the same cores: it runs before the next decode starts (overlapped, TrivialAugmentWide made 3% fewer
        images on 2 cores). Errors go to the consumer in the batch's turn."""
        n = len(self.queues)
        _enter_thread(self.cpus, self.device)
        plans = _Plans(self.maker, self.batches, self.epoch, n)
        # The consumer reads batch k from queue k % n: this worker's batches from the first at or after `start`.
        ks = range(start + (w - start) % n, len(self.batches), n)
        current = None  # the batch being made: a decoders.Pending
        try:
            overlap = self.stage is None  # CUDA: the next batch decodes while this one is handed over
            for i, k in enumerate(ks):
                if current is None and (current := self.begin(w, k, plans)) is None:
                    return  # stopped
                following = ks[i + 1] if i + 1 < len(ks) else None
                if following is not None:
                    plans.ahead(following)  # while batch k decodes
                batch, current = current.finish(), None
                if overlap and following is not None and (current := self.begin(w, following, plans)) is None:
                    return
                if not self.hand_over(w, batch):
                    return
        except BaseException as e:  # handed to the consumer, raised in the training loop
            self.put(self.queues[w], e)
        finally:
            if current is not None:  # stopped or failed with a batch in the making: its decode waited for
                current.close()

    def begin(self, w, k, plans):
        """Batch k begun in a free slot (a decoders.Pending; one that raises in its turn where it could not be
        begun), or None once the producers are stopped."""
        slot = self.take(self.free[w])
        if slot is None:
            return None
        try:
            slot.wait_reusable()
            return self.maker.start(self.batches[k], self.epoch, slot, k, plans.get(k))
        except Exception as e:
            self.free[w].put(slot)
            return decoders.Pending.failed(e)

    def hand_over(self, w, batch):
        """Puts the batch in the consumer's queue: on the CPU finished by the stage here, on CUDA queued on the
        side stream; its slot is free again then. False once the producers are stopped."""
        if self.stage is not None:  # CPU: finish the batch here; the slot is free again at once
            item = (*self.stage(batch), batch.counts)
        else:  # CUDA: queued on the side stream; the slot is reusable once the copy (or kernel) read it
            item = (self.submit(batch), batch.counts)
        self.free[w].put(batch.slot)
        return self.put(self.queues[w], item)

    def submit(self, batch):
        t = time.perf_counter()
        handle = self.pipe.submit(batch.data, batch.offsets, batch.shapes, batch.matrices, batch.labels,
                                  batch.nbytes, params=batch.params, batch_plan=batch.batch_plan)
        # A host slot is free once copied; a device one (decoder="nvjpeg") once the kernel has read it.
        batch.slot.copied = handle.ready if batch.data.is_cuda else handle.copied
        self.stats.add(stage=time.perf_counter() - t)
        return handle

    def close(self, timeout=5.0):
        """Stops the threads and waits (at most `timeout` seconds in all) until none is inside run() (a batch in
        the making is waited for there), so none is in native code when the interpreter exits (a thread that
        returns from a GIL-free torch op then is ended by the interpreter, unwinding through noexcept C++ frames:
        std::terminate; fastload's own native calls stay put instead, bindings.cpp's ReleasedGil). A thread that
        enters run() later sees `stop`."""
        self.stop.set()
        if _exiting:  # _stop_all has waited for them already
            timeout = 0.0
        me = threading.current_thread()  # the garbage collector may run a __del__ on a producer thread
        deadline = time.monotonic() + timeout
        with self.changed:
            idle = self.changed.wait_for(lambda: not self.running - {me}, timeout)
        for t in self.threads:
            if t.is_alive() and t is not me:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        if idle:  # else the exit's _stop_all waits for them again
            _live.discard(self)

    def forget(self):
        """In a forked child: the threads are the parent's; mark everything stopped, wait for nothing (the locks
        may have been held by the parent's threads at the fork, so new ones)."""
        self.stop = threading.Event()
        self.stop.set()
        self.running, self.changed = set(), threading.Condition()
        self.threads = []


class _EpochIterator:
    def __init__(self, loader, batches, start, epoch):
        self.loader = loader
        self.batches = batches
        self.next_batch = start
        self.epoch = epoch
        self.paused = False  # stopped by loader.close(): the next __next__ starts producers at next_batch
        self.retired = False  # a newer iter(loader) took over: using this one is an error
        self.last_taken = None  # decoder="auto": when the loop took the previous batch of this run of producers
        # Batch next_batch's item once taken off its queue, until the loop has it: an interrupt (Ctrl-C) in between
        # leaves it here for the next call instead of losing it and taking the batches after it out of order.
        self.held = None
        self.producers = None  # set last: an interrupt while they start leaves None here (they stop themselves)
        self.producers = _Producers(loader, batches, start, epoch)

    def _next_item(self):
        """Batch next_batch's item from its producer's queue (or the one held since a call cut short)."""
        if self.held is None:
            self._take()
        item = self.held
        if isinstance(item, BaseException):
            self.held = None
            self.close()
            raise item
        return item

    def _handed_out(self):
        """The held batch is the loop's now: the counters first (an interrupt after them loses nothing), then the
        next epoch's producers if this one's are on their last round."""
        self.held = None
        self.next_batch += 1
        if self.loader._counting_iterator() is self:
            self.loader._batches_done += 1
        if self.next_batch >= len(self.batches) - len(self.producers.queues) and self.loader._iterator is not None \
                and self.loader._iterator() is self:
            self.loader._start_next_epoch(self.epoch + 1)

    def _take(self):
        p = self.producers
        q = p.queues[self.next_batch % len(p.queues)]
        t = time.perf_counter()
        while True:
            try:
                self.held = q.get(timeout=_POLL)
                break
            except queue.Empty:
                if self.paused or p.stop.is_set():  # closed while waiting (loader.close() from a signal handler)
                    if self.paused:
                        self._resume()
                    if self.producers is p or self.producers.stop.is_set():
                        raise StopIteration
                    p = self.producers  # resumed: wait for the batch from the new producers
                    q = p.queues[self.next_batch % len(p.queues)]
                    continue
                if not any(th.is_alive() for th in p.threads) and q.empty():
                    raise RuntimeError("fastload producer threads stopped unexpectedly")
                waited = time.perf_counter() - t
                if self.loader.timeout is not None and waited > self.loader.timeout:
                    self.paused = False
                    p.close(timeout=0)  # stuck threads are not waited for here (the exit still waits for them)
                    raise TimeoutError(f"no batch for {waited:.3g} s (timeout={self.loader.timeout}): batch "
                                       f"{self.next_batch} of epoch {self.loader._epoch} is stuck reading or decoding")
        self.loader._stats.add(wait=time.perf_counter() - t)

    def __iter__(self):
        return self

    def __next__(self):
        loader = self.loader
        if self.retired:
            raise RuntimeError("this FastLoader iteration was replaced by a newer iter(loader), which went on from its "
                               "position: a loader runs one iteration at a time (a second loop over the same loader, "
                               "zip(loader, loader), or next(iter(loader)) inside the loop); build a second "
                               "FastLoader to read the data twice at once")
        if self.paused:
            self._resume()
        if self.producers.stop.is_set():
            raise StopIteration
        if loader.device.type == "cpu":
            if self.next_batch >= len(self.batches):
                return self._finish()
            x, y, counts = self._next_item()
        else:  # the producers queued the batch on the side stream: the training stream waits for it
            if self.next_batch >= len(self.batches):
                return self._finish()
            handle, counts = self._next_item()
            x, y = loader._device_pipe().receive(handle)  # again for a held batch: it only waits and records
        loader._stats.add(images=len(y), batches=1, **counts)
        self._handed_out()
        if loader._trial is not None:
            self._time_decoder(len(y))
        return x, y

    def _time_decoder(self, images):
        """decoder="auto": the loop's pace for the trial; on the trial's word, the next batches by another decoder
        (the batches the old producers had queued are made again by the new ones)."""
        now = time.perf_counter()
        interval, self.last_taken = (None if self.last_taken is None else now - self.last_taken), now
        switch = self.loader._trial.taken(images, interval)
        if switch is None:
            return
        loader = self.loader
        if loader._ahead is not None:  # the next epoch's producers, started early with the old decoder
            loader._ahead.close()
            loader._ahead = None
        if self.next_batch >= len(self.batches):  # the epoch is made: the next one starts with the new decoder
            loader._use_decoder(decoders.KINDS[switch])
            return
        self.producers.close()
        loader._use_decoder(decoders.KINDS[switch])
        self._restart_producers()

    def _restart_producers(self):
        """New producers from next_batch (after a pause, or with another decoder)."""
        self.loader.pipeline.set_epoch_size(self.epoch, self.size)
        self.last_taken = None  # the gap is no interval of the loop's
        self.held = None  # the new producers make that batch again
        self.producers = None
        self.producers = _Producers(self.loader, self.batches, self.next_batch, self.epoch)

    def _finish(self):
        if self.loader._counting_iterator() is self:
            self.loader._finished_epoch = True
        self.close()
        raise StopIteration

    def live(self):
        """Whether it has batches to come and producers making them (not finished, failed or closed)."""
        return self.producers is not None and not self.producers.stop.is_set() and self.next_batch < len(self.batches)

    def retire(self):
        """A newer iteration takes over: stop, and raise if asked for another batch."""
        self.retired = self.next_batch < len(self.batches)
        self.close()

    def pause(self):
        """Stops the producers of a live iterator; unlike close(), it goes on at its next batch if asked for one."""
        self.close()
        self.paused = True

    def _resume(self):
        """New producers from next_batch, if the loader still holds the position close() left for this iterator
        (no new iteration, set_epoch or load_state_dict since); else it stays stopped."""
        self.paused = False
        loader = self.loader
        if loader._paused is None or loader._paused() is not self:
            return
        loader._start_batch, loader._resume_size, loader._paused = 0, None, None  # the position is ours again
        self._restart_producers()

    def close(self):
        self.paused = False
        if self.producers is not None:
            self.producers.close()

    def __del__(self):
        self.close()
