"""FastLoader under torch.distributed: 2 processes with the gloo backend on the CPU (torchrun's environment),
rank and world size picked up from the process group. Shards are disjoint, cover the dataset, have equal
lengths; a rerun gives identical batches; a rank preempted mid-epoch resumes exactly from its state_dict."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

WORKER = textwrap.dedent("""
    import hashlib, json, os, sys
    import torch, torch.distributed as dist
    import fastload as fl

    root, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    late_error = None
    if mode == "late":  # a loader built before the process group exists
        try:
            fl.FastLoader(fl.FolderDataset(root), batch_size=3, threads=1)
        except RuntimeError as e:
            late_error = str(e)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = fl.FolderDataset(root)

    def make(crop=None, **kw):
        return fl.FastLoader(ds, batch_size=3, seed=11, crop=crop or fl.RandomResizedCrop(32), threads=1, **kw)

    def digest(x):
        return hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]

    result = {"rank": rank, "world": dist.get_world_size(), "late_error": late_error}
    if mode == "full":
        loader = make()
        result["len"] = len(loader)
        for epoch in range(2):
            loader.set_epoch(epoch)
            result[f"indices{epoch}"] = loader.sampler.epoch_indices(epoch).tolist()
            result[f"batches{epoch}"] = [(digest(x), y.tolist()) for x, y in loader]
        # An equal number of batches on every rank: the all_reduce per step DDP does never waits forever.
        steps = torch.tensor([len(result["batches0"])])
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        result["max_steps"] = int(steps)
        ev = make(shuffle=False, pad=False, crop=fl.CenterCrop(32))
        result["eval_labels"] = [y.tolist() for _, y in ev]
    elif mode == "preempt":  # epoch 1, stop after 2 batches and save the state, as a checkpoint would
        loader = make()
        loader.set_epoch(1)
        for i, _ in enumerate(loader):
            if i == 1:
                break
        result["state"] = loader.state_dict()
    elif mode == "resume":  # ("late" records only late_error)
        state = json.load(open(out + f".state{rank}"))
        loader = make()
        loader.load_state_dict(state)
        result["batches1"] = [(digest(x), y.tolist()) for x, y in loader]
    json.dump(result, open(out + f".{mode}{rank}", "w"))
    dist.destroy_process_group()
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script, root, out, mode, world=2):
    """Starts `world` ranks with torchrun's environment variables (loopback rendezvous) and waits."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(root), str(out), mode], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
    return [json.load(open(f"{out}.{mode}{r}")) for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, imagenet_dir):
    tmp = tmp_path_factory.mktemp("dist")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    return tmp, script


def test_two_ranks_shard_rerun_and_resume(runs, imagenet_dir):
    tmp, script = runs
    import fastload as fl
    ds = fl.FolderDataset(imagenet_dir)
    n = len(ds)
    first = launch(script, imagenet_dir, tmp / "a", "full")
    for epoch in range(2):
        shards = [set(r[f"indices{epoch}"]) for r in first]
        lengths = [len(r[f"indices{epoch}"]) for r in first]
        assert lengths[0] == lengths[1] == -(-n // 2)  # equal, padded by wrapping around
        assert shards[0] | shards[1] == set(range(n))
        assert len(shards[0] & shards[1]) == 2 * lengths[0] - n  # overlap only where padding wrapped
        for r in first:  # every label belongs to the sample it names
            labels = [y for _, ys in r[f"batches{epoch}"] for y in ys]
            assert labels == ds.labels[np.array(r[f"indices{epoch}"])].tolist()
    assert first[0]["indices0"] != first[0]["indices1"]  # reshuffled per epoch
    assert first[0]["len"] == first[1]["len"] == first[0]["max_steps"]
    # Eval without padding: every sample exactly once over the ranks.
    eval_labels = sorted(y for r in first for batch in r["eval_labels"] for y in batch)
    assert eval_labels == sorted(ds.labels.tolist())
    # Identical results when re-run.
    again = launch(script, imagenet_dir, tmp / "b", "full")
    for r1, r2 in zip(first, again):
        assert r1["batches0"] == r2["batches0"] and r1["batches1"] == r2["batches1"]
    # Preemption after 2 batches of epoch 1, then a restart from each rank's saved state.
    pre = launch(script, imagenet_dir, tmp / "c", "preempt")
    for r in pre:
        json.dump(r["state"], open(f"{tmp / 'c'}.state{r['rank']}", "w"))
    resumed = launch(script, imagenet_dir, tmp / "c", "resume")
    for full, res in zip(sorted(first, key=lambda r: r["rank"]), sorted(resumed, key=lambda r: r["rank"])):
        assert res["batches1"] == full["batches1"][2:]


def test_a_loader_built_before_the_process_group_is_refused(runs, imagenet_dir):
    # It took rank 0 of 1: every rank trained on the whole dataset, in the same order, with the same draws
    tmp, script = runs
    for r in launch(script, imagenet_dir, tmp / "late", "late"):
        assert r["late_error"] is not None and "WORLD_SIZE=2" in r["late_error"], r
        assert "init_process_group" in r["late_error"]
