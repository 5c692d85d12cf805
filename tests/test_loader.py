"""FastLoader on the CPU: labels stay with their images, determinism, resume, pixels against torchvision,
errors, memory and thread hygiene. Real photos throughout."""
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from skimage import data as photos

import fastload as fl
from fastload import loader as loader_module
from fastload import transforms as T
from fastload.producer import Slot

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLASSES = 6


def class_level(k):
    return 20 + 40 * k  # blue level that encodes class k; 40 apart survives JPEG and resampling


@pytest.fixture(scope="module")
def coded_dir(tmp_path_factory):
    """Real photos whose blue channel is a flat level encoding the class, so any crop tells its class."""
    root = tmp_path_factory.mktemp("coded")
    rng = np.random.default_rng(0)
    sources = [photos.astronaut(), photos.chelsea(), photos.coffee()]
    for k in range(CLASSES):
        (root / f"class_{k}").mkdir()
        for j in range(7):
            src = sources[(k + j) % 3]
            h, w = rng.integers(180, src.shape[0]), rng.integers(180, src.shape[1])
            top, left = rng.integers(0, src.shape[0] - h + 1), rng.integers(0, src.shape[1] - w + 1)
            img = np.ascontiguousarray(src[top:top + h, left:left + w]).copy()
            img[..., 2] = class_level(k)
            Image.fromarray(img).save(root / f"class_{k}" / f"{j}.jpg", quality=92)
    return root


def blue_to_class(x):
    blue = x[:, 2].float().mean(dim=(1, 2)) * STD[2] + MEAN[2]  # undo normalise -> 0..1
    return torch.round((blue * 255 - 20) / 40).long()


def collect(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def test_labels_match_images_across_shuffled_threaded_epochs(coded_dir):
    ds = fl.FolderDataset(coded_dir)
    loader = fl.FastLoader(ds, batch_size=5, shuffle=True, seed=1, crop=fl.RandomResizedCrop(48), threads=4)
    orders = []
    for epoch in range(3):
        seen = []
        for x, y in loader:
            assert x.shape[1:] == (3, 48, 48) and x.dtype == torch.float32 and y.dtype == torch.int64
            assert torch.equal(blue_to_class(x), y)
            seen.extend(y.tolist())
        assert sorted(seen) == sorted(ds.labels.tolist())  # every sample once per epoch
        orders.append(seen)
    assert orders[0] != orders[1]  # epochs advance on their own and reshuffle


def test_same_seed_same_batches_whatever_the_threads(coded_dir):
    ds = fl.FolderDataset(coded_dir)
    make = lambda threads, workers: fl.FastLoader(ds, batch_size=8, seed=7, crop=fl.RandomResizedCrop(40),
                                                  threads=threads, workers=workers)
    a = collect(make(1, 1))
    b = collect(make(4, 3))
    assert len(a) == len(b) == len(make(1, 1))
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    c = collect(fl.FastLoader(ds, batch_size=8, seed=8, crop=fl.RandomResizedCrop(40)))
    assert not all(torch.equal(xa, xc) for (xa, _), (xc, _) in zip(a, c))


def test_resume_from_state_dict_yields_exactly_the_remaining_batches(coded_dir):
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(32))
    reference = make()
    collect(reference)  # epoch 0
    full = collect(reference)  # epoch 1
    interrupted = make()
    collect(interrupted)
    for i, _ in enumerate(interrupted):
        if i == 3:
            break
    state = interrupted.state_dict()
    assert state["epoch"] == 1 and state["batches_done"] == 4
    resumed = make()
    resumed.load_state_dict(state)
    rest = collect(resumed)
    assert len(rest) == len(full) - 4
    for (xa, ya), (xb, yb) in zip(full[4:], rest):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    assert resumed.state_dict()["epoch"] == 2  # a finished epoch resumes at the next one


def loader_threads(loader):
    """The producer threads of the loader's current epoch and of the one it started ahead."""
    current = loader._iterator() if loader._iterator is not None else None
    return [t for it in (current, loader._ahead) if it is not None and it.producers is not None
            for t in it.producers.threads]


def fastload_threads():
    """Producer threads (fastload-N)."""
    return [t for t in threading.enumerate() if t.name.startswith("fastload")]


@pytest.mark.parametrize("workers", [1, 2])
def test_each_producer_is_one_python_thread(imagenet_dir, workers):
    """A producer plans its next batches and hands its previous one over in its own thread while its batch
    decodes: the loader runs ``workers`` Python threads and no others (each takes the GIL from the training
    thread), and its batches are those of the one-at-a-time path."""
    assert_no_fastload_threads()  # other tests' loaders gone: the threads below are this one's
    transform = T.Compose([T.RandomResizedCrop(32), T.TrivialAugmentWide()])
    loader = fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, workers=workers, transform=transform)
    it = iter(loader)
    first = next(it)
    # this epoch's producers (and the next epoch's, started ahead as this one ends): no thread of another kind
    assert {t.name for t in fastload_threads()} == {f"fastload-{w}" for w in range(workers)}
    assert len(loader._iterator().producers.threads) == workers
    rest = list(it)
    maker = loader._maker
    for k, (x, y) in enumerate([first] + rest):
        batch = maker.make(loader._epoch_batches(0)[k], 0, Slot(pin=False), k)
        x_ref, y_ref = loader._stage_cpu()(batch)
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref), f"batch {k}"
    loader.close()
    assert_no_fastload_threads()


def assert_no_fastload_threads(timeout=10.0):
    """Collects garbage and waits up to `timeout` s for the producer threads to end, then fails with the stack of
    each one left.

    Not at once: loaders whose next epoch started early sit in a reference cycle with it until the garbage
    collector finalises them, and a collection that a producer thread triggered may be doing that in its thread
    (close() waits there for their threads). While it runs, gc.collect() returns at once without collecting."""
    deadline = time.monotonic() + timeout
    while fastload_threads() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    left = fastload_threads()
    frames = sys._current_frames()
    assert not left, "producer threads still running:\n" + "\n".join(
        f"{t.name} ({t.ident}):\n" + "".join(traceback.format_stack(frames[t.ident])) for t in left
        if t.ident in frames)


def test_next_epoch_starts_early_with_the_same_batches(coded_dir):
    """At an epoch's end the next epoch's producers are already decoding; what they give is exactly what a
    fresh start of that epoch gives, and set_epoch to another epoch discards them."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=5, seed=4, crop=fl.RandomResizedCrop(32), workers=2)

    def fresh(epoch):
        loader = make()
        loader.set_epoch(epoch)
        return collect(loader)
    loader = make()
    collect(loader)
    ahead = loader._ahead
    assert ahead is not None and ahead.epoch == 1 and any(t.is_alive() for t in ahead.producers.threads)
    got = collect(loader)
    assert loader._iterator() is ahead  # adopted, not restarted
    expected = fresh(1)
    assert len(got) == len(expected)
    for (xa, ya), (xb, yb) in zip(got, expected):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    unwanted = loader._ahead  # epoch 2, but the loop asks for epoch 5
    loader.set_epoch(5)
    got = collect(loader)
    assert unwanted.producers.stop.is_set() and not any(t.is_alive() for t in unwanted.producers.threads)
    for (xa, ya), (xb, yb) in zip(got, fresh(5)):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    del loader, ahead, unwanted  # a dropped loader stops the producers it started ahead
    assert_no_fastload_threads()

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("threads", [1, 2])
def test_an_error_beginning_a_batch_reaches_the_loop_in_its_turn(imagenet_dir, monkeypatch, device, threads):
    """A batch whose records cannot be read for a reason of the process's (no file descriptor left) raises when
    the loop reaches it, after the batches before it, though its producer reads it early: while handing the batch
    before it over (CUDA, several decode threads) or before it decodes. No thread is left behind."""
    import errno
    from fastload.datasets.folder import _FolderReader
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    loader = fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, shuffle=False, workers=1, threads=threads,
                           device=device, crop=fl.RandomResizedCrop(32))
    real = _FolderReader.sources

    def sources(self, indices):
        if 9 in indices:  # batch 2
            raise OSError(errno.EMFILE, "Too many open files")
        return real(self, indices)
    monkeypatch.setattr(_FolderReader, "sources", sources)
    got = []
    with pytest.raises(OSError, match="Too many open files"):
        for _, y in loader:
            got.append(y.tolist())
    assert got == [[0, 0, 0, 0], [0, 0, 0, 0]]
    del loader
    assert_no_fastload_threads()


def test_an_error_while_planning_ahead_reaches_the_loop_at_its_batch(coded_dir):
    """The producers plan batches ahead of the decode, several in one pass; an exception planning one
    surfaces in the training loop when that batch's turn comes (the batches before it arrive, in order, including
    those planned in a pass with it), and no thread is left behind."""
    ds = fl.FolderDataset(coded_dir)
    loader = fl.FastLoader(ds, batch_size=5, seed=4, crop=fl.RandomResizedCrop(32), workers=2)
    expected = collect(loader)
    assert len(expected) >= 4
    maker = loader._maker
    real = maker.plan
    bad = set(loader._epoch_batches(0)[3])

    def plan(indices, epoch):
        if bad & set(indices.tolist()):
            raise RuntimeError("planning failed for batch 3")
        return real(indices, epoch)
    maker.plan = plan
    loader.set_epoch(0)
    got = []
    with pytest.raises(RuntimeError, match="planning failed for batch 3"):
        for x, y in loader:
            got.append((x, y))
    assert len(got) == 3
    for (xa, ya), (xb, yb) in zip(got, expected):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    del loader, maker, real, plan
    assert_no_fastload_threads()


def test_close_stops_every_producer_and_iteration_resumes(coded_dir):
    """close() stops the epoch's producers and those started ahead for the next epoch, at once and without the
    garbage collector; iterating again gives the batches a fresh loader gives."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=5, seed=4, crop=fl.RandomResizedCrop(32), workers=2)
    loader = make()
    collect(loader)
    assert loader._ahead is not None
    started = loader_threads(loader)
    assert any(t.is_alive() for t in started)
    loader.close()
    assert not any(t.is_alive() for t in started)
    loader.close()  # twice is fine
    fresh = make()
    for (xa, ya), (xb, yb) in zip(collect(loader), collect_epoch(fresh, 1)):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    fresh.close()
    partial = iter(loader)  # mid-epoch
    next(partial)
    started = loader_threads(loader)
    assert started
    loader.close()
    assert not any(t.is_alive() for t in started)


def test_close_mid_epoch_loses_no_batch(coded_dir):
    """close() in the middle of an epoch (before a DataLoader forks, say): the loop goes on with the next batch,
    and a new iter() instead resumes where the loop was, as state_dict says; nothing is skipped or repeated."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=5, seed=6, crop=fl.RandomResizedCrop(32), workers=2)
    full = collect(make())
    loader = make()
    got = []
    for step, (x, y) in enumerate(loader):
        got.append((x, y))
        if step in (1, 2):  # twice, the second right after the producers restarted
            loader.close()
            assert loader.state_dict()["batches_done"] == step + 1
    assert len(got) == len(full)
    for (xa, ya), (xb, yb) in zip(full, got):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    assert loader.state_dict()["epoch"] == 1  # the epoch ended normally
    second = make()
    it = iter(second)
    head = [next(it) for _ in range(3)]
    second.close()
    assert second.state_dict()["batches_done"] == 3
    rest = collect(second)  # a new iteration: the epoch's remaining batches
    assert len(head) + len(rest) == len(full)
    for (xa, ya), (xb, yb) in zip(full, head + rest):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    with pytest.raises(RuntimeError, match="replaced by a newer iter"):  # the new iteration took over
        next(it)
    assert second.state_dict()["epoch"] == 1


def same_batches(a, b):
    return len(a) == len(b) and all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))


def test_a_loop_that_stops_early_goes_on_where_it_stopped(coded_dir):
    """A break (or an exception) mid-epoch leaves the loader after the last batch handed out: the next loop goes on
    there, as state_dict says (a loop breaking after N steps must not see the same N batches every time), and once
    the epoch's last batch is out, by StopIteration or not, the next loop runs the next epoch."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(24), workers=2)
    epochs = [collect_epoch(make(), e) for e in range(3)]
    n = len(epochs[0])
    loader = make()
    got = []
    for _ in range(2):  # two "epochs" of 3 steps each
        for step, (x, y) in enumerate(loader):
            got.append((x.clone(), y.clone()))
            if step == 2:
                break
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 6)
    resumed = make()
    resumed.load_state_dict(state)
    rest = collect(loader)
    assert same_batches(got + rest, epochs[0])
    assert same_batches(collect(resumed), rest)  # the checkpoint taken after the break continues the same way
    it = iter(loader)  # epoch 1, taken with next() to its last batch, without the StopIteration
    taken = [next(it) for _ in range(n)]
    assert same_batches(taken, epochs[1]) and loader.state_dict()["epoch"] == 2
    assert same_batches(collect(loader), epochs[2])
    loader.set_epoch(0)  # set_epoch starts an epoch at its first batch
    assert same_batches(collect(loader)[:2], epochs[0][:2])


def test_one_iteration_at_a_time(coded_dir):
    """A second iter() takes over the position; the first iterator then raises instead of ending quietly (a nested
    loop over the same loader would otherwise cut the outer epoch short without a word)."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(24), workers=2)
    full = collect(make())
    loader = make()
    outer = iter(loader)
    first = next(outer)
    peek = next(iter(loader))  # batch 1: the new iteration went on from the outer one's position
    assert same_batches([first, peek], full[:2])
    with pytest.raises(RuntimeError, match="replaced by a newer iter"):
        next(outer)
    with pytest.raises(RuntimeError, match="replaced by a newer iter"):
        list(zip(loader, loader))


def test_the_samplers_set_epoch_selects_the_loaders_epoch(coded_dir):
    """`loader.sampler.set_epoch(e)`, the DDP habit (torchvision's reference scripts), selects epoch e as
    loader.set_epoch does: a run resumed from a model checkpoint alone gets epoch e's shuffle and crops."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(24), workers=2)
    loader = make()
    loader.sampler.set_epoch(2)
    assert same_batches(collect(loader), collect_epoch(make(), 2))


def test_a_forked_child_does_not_wait_for_the_parents_threads(coded_dir):
    """os.fork copies the loader but not its threads: closing it, a new iteration, and the exit in the child must
    not wait on threads that exist only in the parent (each waited its 5 s timeout)."""
    ds = fl.FolderDataset(coded_dir)
    loader = fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(24), workers=2)
    it = iter(loader)
    next(it)
    r, w = os.pipe()
    import warnings
    with warnings.catch_warnings():  # "this process is multi-threaded, use of fork() may lead to deadlocks"
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report (seconds to close, batches of a new iteration), leave without cleanup
        try:
            t = time.monotonic()
            loader.close()
            closed = time.monotonic() - t
            batches = len(collect(loader))
            os.write(w, f"{closed:.3f} {batches}".encode())
        finally:
            os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    closed, batches = os.read(r, 100).decode().split()
    os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0
    assert float(closed) < 1.0, f"close() in the child took {closed} s"
    assert int(batches) == len(loader) - 1  # it went on after the batch the parent had taken
    assert len(collect(loader)) == len(loader) - 1  # the parent's own loop is untouched by the child


def test_close_keeps_a_position_chosen_since_the_iteration_began(coded_dir):
    """set_epoch or load_state_dict after some batches, then close(): the chosen position stands for the next
    iteration (close() records the running iterator's position only while it is still the loader's), and the old
    iterator, finished or not, neither resumes nor moves it."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=5, seed=6, crop=fl.RandomResizedCrop(32), workers=2)
    epoch1 = collect_epoch(make(), 1)
    loader = make()
    it = iter(loader)
    for _ in range(3):
        next(it)
    loader.set_epoch(1)
    loader.close()
    got = collect(loader)
    assert len(got) == len(epoch1) and all(torch.equal(a[1], b[1]) for a, b in zip(got, epoch1))
    epoch0 = collect(make())
    loader = make()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    for _ in range(4):
        next(it)
    loader.load_state_dict(state)
    loader.close()
    with pytest.raises(StopIteration):
        next(it)
    assert loader.state_dict()["batches_done"] == 1
    got = collect(loader)
    assert len(got) == len(epoch0) - 1 and all(torch.equal(a[1], b[1]) for a, b in zip(got, epoch0[1:]))
    finished = iter(loader)  # epoch 1, to its end
    collect_now = [y for _, y in finished]
    loader.close()
    loader.load_state_dict(state)  # epoch 0, batch 1
    with pytest.raises(StopIteration):
        next(finished)
    assert loader.state_dict()["batches_done"] == 1 and len(collect(loader)) == len(epoch0) - 1
    assert len(collect_now) == len(epoch1)


def test_close_twice_mid_loop_goes_on(coded_dir):
    """Two close() calls in a row mid-loop (two helpers each closing before they fork): the loop still gets every
    batch of its epoch, and the next loop runs the next epoch (the second call used to end the loop early)."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=5, seed=6, crop=fl.RandomResizedCrop(32), workers=2)
    epochs = [collect_epoch(make(), e) for e in range(2)]
    loader = make()
    got = []
    for step, (x, y) in enumerate(loader):
        got.append((x, y))
        if step == 1:
            loader.close()
            loader.close()
    assert same_batches(got, epochs[0])
    assert same_batches(collect(loader), epochs[1])


def test_set_epoch_and_load_state_dict_during_a_loop_keep_state_dict_right(coded_dir):
    """set_epoch of the running epoch at every step changes nothing; set_epoch of another epoch, or
    load_state_dict, mid-loop: the loop finishes its own epoch without moving the position state_dict saves, and
    that position gives what the same process runs next."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(24), workers=2)
    epochs = [collect_epoch(make(), e) for e in range(2)]
    n = len(epochs[0])
    loader = make()  # a step-based loop that calls set_epoch(step // n) at every step
    for step, _ in enumerate(loader):
        loader.set_epoch(0)
        if step == 4:
            break
    paused = make()  # the same after close() paused the loop (before forking a DataLoader, say)
    got = []
    for step, (x, y) in enumerate(paused):
        got.append((x, y))
        if step == 2:
            paused.close()
            paused.set_epoch(0)
    assert same_batches(got, epochs[0]) and same_batches(collect(paused), epochs[1])
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 5)
    resumed = make()
    resumed.load_state_dict(state)
    assert same_batches(collect(resumed), epochs[0][5:])

    loader = make()
    got = []
    for step, (x, y) in enumerate(loader):
        got.append((x, y))
        if step == 2:
            loader.set_epoch(1)  # for the next loop
            assert (loader.state_dict()["epoch"], loader.state_dict()["batches_done"]) == (1, 0)
    assert same_batches(got, epochs[0])
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    resumed = make()
    resumed.load_state_dict(state)
    assert same_batches(collect(loader), epochs[1]) and same_batches(collect(resumed), epochs[1])

    loader = make()
    it = iter(loader)
    next(it)
    saved = loader.state_dict()  # epoch 0, batch 1
    rest = [next(it) for _ in range(4)]
    loader.load_state_dict(saved)  # roll back: the next loop starts there; this one goes on with its own batches
    rest += list(it)
    assert same_batches(rest, epochs[0][1:])
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches_done"]) == (0, 1)
    assert same_batches(collect(loader), epochs[0][1:])


def test_a_state_saved_on_an_epochs_last_batch_resumes_with_the_loops_own_epoch_counter(coded_dir):
    """A checkpoint inside the loop on the epoch's last batch, the loop's epoch counter saved beside it: on resume,
    set_epoch(that counter) gives an empty epoch and set_epoch(counter + 1) the next one, as the run that saved it
    went on; without set_epoch the next loop is the next epoch."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(24), workers=2)
    epochs = [collect_epoch(make(), e) for e in range(2)]
    loader = make()
    for step, _ in enumerate(loader):
        if step == len(epochs[0]) - 1:
            state = loader.state_dict()
    assert (state["epoch"], state["batches_done"], state["after_epoch"]) == (1, 0, 0)
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(0)
    assert collect(resumed) == []
    resumed.set_epoch(1)
    assert same_batches(collect(resumed), epochs[1])
    plain = make()
    plain.load_state_dict(state)
    assert same_batches(collect(plain), epochs[1])
    with pytest.raises(ValueError, match="batches_done"):
        make().load_state_dict(dict(state, batches_done=len(epochs[0]) + 1))
    with pytest.raises(ValueError, match="batches_done"):
        make().load_state_dict(dict(state, batches_done=-1))


@pytest.mark.parametrize("where", ["wait", "images", "next epoch"])
def test_an_interrupt_inside_next_loses_no_batch(coded_dir, where):
    """A KeyboardInterrupt after a batch left its queue but before next() returned it (a notebook stepping a held
    iterator; injected in the stats call right after the queue's get, or the one before next() returns): the next
    call returns that batch, and the rest follow in order."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(24), workers=2)
    full = collect(make())
    loader = make()
    it = iter(loader)
    got = [next(it) for _ in range(2)]
    add = loader._stats.add

    def interrupted(**kw):
        if where in kw:
            loader._stats.add = add
            raise KeyboardInterrupt
        return add(**kw)

    if where == "next epoch":  # starting the next epoch's producers, after the batch was counted
        got += [next(it) for _ in range(len(full) - 2 - len(loader._iterator().producers.queues))]
        start = loader._start_next_epoch

        def starting(epoch):
            loader._start_next_epoch = start
            raise KeyboardInterrupt

        loader._start_next_epoch = starting
        with pytest.raises(KeyboardInterrupt):
            got.append(next(it))
        got.append(None)  # the batch next() was returning when interrupted: the loop had it counted
        rest = list(it)
        assert loader.state_dict()["epoch"] == 1 and same_batches(rest, full[len(got):])
        return
    loader._stats.add = interrupted
    with pytest.raises(KeyboardInterrupt):
        next(it)
    got += list(it)
    assert same_batches(got, full)


def test_close_from_a_signal_handler_while_waiting_for_a_batch(coded_dir):
    """loader.close() runs while the loop waits inside next() (a SIGALRM handler here): the wait goes on with
    new producers and the epoch comes out whole, as without the signal."""
    import signal

    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=5, seed=2, crop=fl.RandomResizedCrop(32), workers=1, threads=1,
                                 prefetch=1)
    full = collect(make())
    loader = make()
    make_batch = loader._maker.make
    loader._maker.make = lambda *a, **k: (time.sleep(0.3), make_batch(*a, **k))[1]  # next() waits ~0.3 s
    previous = signal.signal(signal.SIGALRM, lambda *_: loader.close())
    try:
        got = []
        for step, (x, y) in enumerate(loader):
            got.append((x.clone(), y.clone()))
            if step in (0, 2):
                signal.setitimer(signal.ITIMER_REAL, 0.1)  # fires while the next batch is awaited
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(got) == len(full)
    for (xa, ya), (xb, yb) in zip(full, got):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def collect_epoch(loader, epoch):
    loader.set_epoch(epoch)
    return collect(loader)


@pytest.mark.parametrize("workers", [2, 3])
def test_resume_at_any_batch_with_several_workers(coded_dir, workers):
    """Every resume point, with the batch count not a multiple of the workers; set_epoch of the restored epoch
    (what a DDP loop calls at the top of each epoch) keeps the position."""
    ds = fl.FolderDataset(coded_dir)
    make = lambda: fl.FastLoader(ds, batch_size=4, seed=9, crop=fl.RandomResizedCrop(24), workers=workers)
    full = collect(make())
    for stop in range(1, len(full)):
        first = make()
        for i, _ in enumerate(first):
            if i == stop - 1:
                break
        resumed = make()
        resumed.load_state_dict(first.state_dict())
        resumed.set_epoch(0)
        rest = collect(resumed)
        assert [y.tolist() for _, y in rest] == [y.tolist() for _, y in full[stop:]], stop
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(rest, full[stop:]))


def torchvision_reference(ds, plan, indices):
    """torchvision's pixels for the same windows: Pillow decode, resized_crop(antialias), flip, normalise."""
    out = []
    for k, i in enumerate(indices):
        img = TF.pil_to_tensor(Image.open(ds.samples[i][0]).convert("RGB")).float()
        top, left, h, w, _ = (int(v) for v in plan.windows[k])
        x = TF.resized_crop(img, top, left, h, w, list(ds_crop_size(plan)), antialias=True)
        if plan.flipped[k]:
            x = TF.horizontal_flip(x)
        out.append(TF.normalize(x / 255, MEAN, STD))
    return torch.stack(out)


def ds_crop_size(plan):
    return (64, 64)


@pytest.mark.parametrize("dct", [False, True])
def test_batches_match_torchvision_on_the_same_windows(imagenet_dir, dct):
    ds = fl.FolderDataset(imagenet_dir)
    crop = fl.RandomResizedCrop(64, dct_downscale=dct)
    loader = fl.FastLoader(ds, batch_size=16, seed=5, crop=crop, shuffle=True)
    indices = loader.sampler.epoch_indices(0)[:16]
    plan = crop.plan(ds.heights[indices], ds.widths[indices], 5, 0, indices)
    x, y = next(iter(loader))
    ref = torchvision_reference(ds, plan, indices)
    assert torch.equal(y, torch.from_numpy(ds.labels[indices]))
    if not dct:
        # Same decoder output (bit-exact with Pillow) and the same filter: float rounding only.
        assert (x - ref).abs().max().item() <= 1e-3 / 0.225
    else:
        # DCT downscaling changes pixels slightly: PSNR on 0..1 values, per image.
        a, b = x * torch.tensor(STD)[:, None, None], ref * torch.tensor(STD)[:, None, None]
        mse = ((a - b) ** 2).mean(dim=(1, 2, 3))
        psnr = 10 * torch.log10(1 / mse)
        assert psnr.median() >= 35 and psnr.min() >= 28, psnr


def test_center_crop_eval_matches_torchvision(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    loader = fl.FastLoader(ds, batch_size=8, shuffle=False, crop=fl.CenterCrop(56, resize=64, dct_downscale=False))
    x, y = next(iter(loader))
    for k in range(8):
        img = TF.pil_to_tensor(Image.open(ds.samples[k][0]).convert("RGB")).float()
        ref = TF.center_crop(TF.resize(img, 64, antialias=True), 56)
        ref = TF.normalize(ref / 255, MEAN, STD)
        assert (x[k] - ref).abs().max().item() <= 1e-3 / 0.225


def test_eval_pipelines_give_torchvisions_pixels_on_large_photos(hd_dir):
    """1080p photos, more than twice every eval resize: the recipes' eval pipeline and the CenterCrop shorthand,
    left at their defaults, decode at full scale and give torchvision's Resize + CenterCrop (the DCT scale had
    put them 31-41 dB from it, up to 57 levels off), and their plans say so."""
    ds = fl.FolderDataset(hd_dir)
    for crop, transform, resize in [(fl.CenterCrop(224, resize=256), None, 256),
                                    (None, fl.recipes.torchvision_v2().eval, 232)]:
        loader = fl.FastLoader(ds, batch_size=len(ds), shuffle=False, crop=crop, transform=transform)
        x, _ = next(iter(loader))
        windows = loader.pipeline.plan(np.asarray(ds.heights), np.asarray(ds.widths), 0, 0, np.arange(len(ds))).windows
        assert (np.asarray(windows)[:, 4] == 1).all()
        for k in range(len(ds)):
            img = TF.pil_to_tensor(Image.open(ds.samples[k][0]).convert("RGB")).float()
            ref = TF.normalize(TF.center_crop(TF.resize(img, resize, antialias=True), 224) / 255, MEAN, STD)
            assert (x[k] - ref).abs().max().item() <= 1e-3 / 0.225


def test_outputs_dtype_layout_and_stats(coded_dir):
    ds = fl.FolderDataset(coded_dir)
    loader = fl.FastLoader(ds, batch_size=10, crop=fl.RandomResizedCrop(32), dtype=torch.bfloat16,
                           channels_last=True, drop_last=True)
    batches = collect(loader)
    assert len(batches) == len(loader) == len(ds) // 10
    for x, y in batches:
        assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(blue_to_class(x.float()), y)
    s = loader.stats()
    assert s["images"] == 10 * len(batches) and s["images_per_s"] > 0
    assert {"read_s", "decode_s", "stage_s", "wait_s", "skipped", "fallback"} <= set(s)


@pytest.fixture()
def broken_dir(tmp_path, coded_dir):
    """A copy of two classes plus one PNG."""
    for k in range(2):
        (tmp_path / f"c{k}").mkdir()
        for f in sorted((coded_dir / f"class_{k}").iterdir()):
            (tmp_path / f"c{k}" / f.name).write_bytes(f.read_bytes())
    Image.open(coded_dir / "class_1" / "0.jpg").save(tmp_path / "c1" / "z.png")
    return tmp_path


def test_corrupt_sample_raises_with_its_path_or_is_skipped(broken_dir):
    ds = fl.FolderDataset(broken_dir, cache=False)
    victim = broken_dir / "c0" / "0.jpg"
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 3])  # truncated after the scan: the decode itself must catch it
    loader = fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(32))
    with pytest.raises(fl.DecodeError, match="c0/0.jpg"):
        collect(loader)
    skipping = fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(32), on_error="skip")
    first = collect(skipping)
    assert sum(len(y) for _, y in first) == len(ds)
    assert skipping.stats()["skipped"] >= 1 and skipping.stats()["fallback"] >= 1
    again = fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(32), on_error="skip")
    for (xa, ya), (xb, yb) in zip(first, collect(again)):  # replacements are deterministic
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_non_jpeg_goes_through_pillow(broken_dir):
    ds = fl.FolderDataset(broken_dir, cache=False)
    png = [i for i in range(len(ds)) if ds.sample_name(i).endswith(".png")]
    assert png and ds.formats[png[0]] == 1
    loader = fl.FastLoader(ds, batch_size=len(ds), crop=fl.CenterCrop(64, resize=73, dct_downscale=False), shuffle=False,
                           on_error="skip")
    x, y = next(iter(loader))
    img = TF.pil_to_tensor(Image.open(ds.sample_name(png[0])).convert("RGB")).float()
    ref = TF.normalize(TF.center_crop(TF.resize(img, 73, antialias=True), 64) / 255, MEAN, STD)
    assert (x[png[0]] - ref).abs().max().item() <= 1e-3 / 0.225
    assert loader.stats()["fallback"] >= 1


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_rss_flat_over_30_epochs(coded_dir):
    ds = fl.FolderDataset(coded_dir)
    loader = fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(64), threads=2)
    for _ in range(3):  # warm-up: allocator pools, thread stacks
        collect(loader)
    gc.collect()
    before = rss_bytes()
    for _ in range(30):
        for x, y in loader:
            pass
    gc.collect()
    assert rss_bytes() <= before * 1.05, (before, rss_bytes())


def test_break_new_epoch_and_del_leave_no_threads(coded_dir):
    ds = fl.FolderDataset(coded_dir)
    loader = fl.FastLoader(ds, batch_size=2, crop=fl.RandomResizedCrop(32), prefetch=1)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert_no_fastload_threads()
    it = iter(loader)
    next(it)
    fresh = iter(loader)  # starting a new epoch ends the old one's producers
    assert not any(t.is_alive() for t in it.producers.threads)
    next(fresh)
    del it, fresh, loader
    assert_no_fastload_threads()


def run_script(body, timeout=60):
    """Runs body in a fresh interpreter. If it hangs, the test fails with every thread's stack (faulthandler dumps
    them 10 s before the timeout) and with the output so far (unbuffered): a hang at exit shows its last line."""
    code = f"import faulthandler; faulthandler.dump_traceback_later({timeout - 10}, exit=True)\n" + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-u", "-c", code], capture_output=True, text=True, timeout=timeout)
    assert "Timeout (0:" not in r.stderr, f"hung; output: {r.stdout!r}\n{r.stderr}"
    return r


def test_interpreter_exit_and_ctrl_c_mid_epoch_do_not_hang(coded_dir):
    exit_mid_epoch = f"""
        import fastload as fl
        loader = fl.FastLoader(fl.FolderDataset({str(coded_dir)!r}), batch_size=2, prefetch=1)
        it = iter(loader); next(it)
        print("ok")
    """
    r = run_script(exit_mid_epoch)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    # The child installs Python's SIGINT handler itself: one started with SIGINT ignored (a background job of a
    # non-interactive shell, e.g. `nohup make test &`) would otherwise ignore the Ctrl-C and loop until killed.
    # Ctrl-C is pressed every 0.5 s until it lands: Python itself drops a KeyboardInterrupt raised while a finalizer
    # or weakref callback runs ("Exception ignored in ..."; seen once on a GPU host, in a WeakSet callback), as it
    # would drop a user's single press there.
    ctrl_c = f"""
        import os, signal, threading
        import fastload as fl
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loader = fl.FastLoader(fl.FolderDataset({str(coded_dir)!r}), batch_size=2, prefetch=1)
        landed = threading.Event()
        def press():
            while not landed.wait(0.5):
                os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=press, daemon=True).start()
        try:
            while True:
                for x, y in loader:
                    pass
        except KeyboardInterrupt:
            landed.set()
            print("interrupted")
    """
    r = run_script(ctrl_c)
    assert r.returncode == 0 and "interrupted" in r.stdout, r.stderr


@pytest.mark.parametrize("inside_start", [False, True])
def test_interrupt_while_producers_start_stops_those_started(coded_dir, monkeypatch, inside_start):
    """Ctrl-C can land between two producer threads' start(), or inside one after its thread began: the threads
    already running are stopped and waited for (a producer still decoding at interpreter exit aborted the
    process), and the loader iterates normally afterwards."""
    loader = fl.FastLoader(fl.FolderDataset(coded_dir), batch_size=2, workers=3, threads=1)
    real_start, started = threading.Thread.start, []
    live_before = set(loader_module._live)

    def start_then_interrupt(thread):
        if not thread.name.startswith("fastload-"):
            return real_start(thread)
        if started and not inside_start:
            raise KeyboardInterrupt
        real_start(thread)
        started.append(thread)
        if inside_start:
            raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    monkeypatch.undo()
    assert len(started) == 1 and not started[0].is_alive()
    assert set(loader_module._live) <= live_before  # nothing left for the exit hook either
    assert len(list(loader)) == len(loader)


def test_default_threads_share_the_cores(coded_dir, monkeypatch):
    """One decode thread per core in all by default, shared out among the producers, which decode at once; under
    torchrun the local processes share the machine's cores."""
    ds = fl.FolderDataset(coded_dir)
    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    loader = fl.FastLoader(ds)
    assert loader.workers == 2 and loader.threads == max(1, cores // 2)
    assert fl.FastLoader(ds, workers=1).threads == cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert fl.FastLoader(ds).threads == max(1, cores // 2 // 2)
    assert fl.FastLoader(ds, threads=3).threads == 3

def test_bad_arguments():
    with pytest.raises(ValueError, match="on_error"):
        fl.FastLoader([], on_error="ignore")


def test_an_image_wider_than_any_jpeg_does_not_overwrite_its_neighbours(imagenet_dir, tmp_path):
    """A non-JPEG image with a side over 65535 (JPEG's limit): its window gets room of its own, and the JPEGs laid
    out after it in the batch keep their pixels (it used to be written over them)."""
    root = tmp_path / "wide"
    (root / "a").mkdir(parents=True)
    for i, f in enumerate(sorted(imagenet_dir.rglob("*.jpg"))[:5]):
        (root / "a" / f"{i}.jpg").write_bytes(f.read_bytes())
    strip = photos.astronaut()[200:208]  # 8 rows of a real photo, tiled to 66000 columns
    wide = np.ascontiguousarray(np.tile(strip, (1, -(-66000 // strip.shape[1]), 1))[:, :66000])
    Image.fromarray(wide).save(root / "a" / "2_wide.png")  # sorts after 2.jpg: two JPEGs follow it
    common = dict(shuffle=False, crop=fl.CenterCrop(16, resize=(16, 16), dct_downscale=False))
    ds = fl.FolderDataset(root, cache=False)
    assert ds.sample_name(3).endswith("2_wide.png") and (ds.heights[3], ds.widths[3]) == (8, 66000)
    (x, _), = list(fl.FastLoader(ds, batch_size=len(ds), **common))
    (jpegs := root / "jpegs").mkdir()
    (root / "a").rename(jpegs / "a")
    (jpegs / "a" / "2_wide.png").unlink()
    (xj, _), = list(fl.FastLoader(fl.FolderDataset(jpegs, cache=False), batch_size=5, **common))
    assert torch.equal(torch.cat([x[:3], x[4:]]), xj)  # every JPEG exactly as without the wide image
    ref = TF.resize(torch.from_numpy(wide).permute(2, 0, 1).float(), [16, 16], antialias=True) / 255
    ref = TF.normalize(ref, MEAN, STD)
    assert (x[3] - ref).abs().max().item() <= 1e-3 / 0.225  # and the wide image is itself
