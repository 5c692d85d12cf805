"""examples/train_imagenet.py runs on a CPU, evaluates, checkpoints, and resumes exactly (mid-epoch and across an
epoch end): a run interrupted at step 3 and resumed ends with the same weights as one that never stopped."""
import contextlib
import importlib.util
import io
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_imagenet.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_imagenet", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(module, data, checkpoint, *extra):
    argv = ["--train", str(data), "--val", str(data), "--device", "cpu", "--arch", "resnet18", "--size", "48",
            "--batch-size", "8", "--epochs", "2", "--threads", "2", "--print-every", "1", "--checkpoint",
            str(checkpoint), *extra]
    return module.main(argv)


@pytest.fixture(scope="module")
def straight(imagenet_dir, tmp_path_factory):
    """8 steps without interruption (48 images, batch 8: 6 steps per epoch, so step 8 is mid-way through epoch 1),
    evaluating after epoch 0; returns (checkpoint, printed output)."""
    path = tmp_path_factory.mktemp("straight") / "straight.pt"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _run(_example(), imagenet_dir, path, "--limit-steps", "8")
    return torch.load(path, weights_only=True), out.getvalue()


def test_smoke_run_trains_evaluates_and_checkpoints(straight):
    ckpt, out = straight
    assert "epoch 0 eval: top-1" in out and "epoch 0 done: mean loss" in out
    assert ckpt["step"] == 8 and ckpt["loader"]["epoch"] == 1 and ckpt["loader"]["batches_done"] == 2
    assert {"model", "optimizer", "scheduler", "loader", "args"} <= set(ckpt)


@pytest.mark.parametrize("stop", [2, 3])
def test_interrupted_run_resumes_exactly(straight, imagenet_dir, tmp_path, capsys, monkeypatch, stop):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    train = _example()
    path = tmp_path / "resumed.pt"
    _run(train, imagenet_dir, path, "--limit-steps", str(stop))  # stops mid-epoch 0
    first = torch.load(path, weights_only=True)
    assert first["step"] == stop and first["loader"]["epoch"] == 0 and first["loader"]["batches_done"] == stop
    capsys.readouterr()
    _run(train, imagenet_dir, path, "--limit-steps", "8", "--resume", str(path))
    out = capsys.readouterr().out
    assert f"step {stop}, epoch 0, batch {stop} of 6" in out
    assert f"epoch 0 step {stop + 1} " in out and "epoch 0 step 1 " not in out
    assert "epoch 0 eval: top-1" in out  # the resumed run crosses the end of epoch 0

    a, b = straight[0], torch.load(path, weights_only=True)
    assert b["step"] == 8 and a["loader"] == b["loader"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == 8


def test_torchvision_v2_recipe_trains_and_resumes_exactly(imagenet_dir, tmp_path, capsys, monkeypatch):
    """--recipe torchvision_v2 (TrivialAugmentWide, RandomErasing, MixUp/CutMix soft targets into the label-smoothed
    loss; one process, so no repeated augmentation, as torchvision's train.py) for 3 steps, and the same interrupted
    after 2 and resumed: same weights. (Repeats resume exactly too: test_recipes.test_repeats_resume_exactly.)"""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    train = _example()
    recipe = ["--recipe", "torchvision_v2", "--val-size", "48", "--val-resize", "56"]
    straight, resumed = tmp_path / "straight.pt", tmp_path / "resumed.pt"
    _run(train, imagenet_dir, straight, *recipe, "--limit-steps", "3")
    out = capsys.readouterr().out
    assert "recipe torchvision_v2" in out and "TrivialAugmentWide" in out and "epoch 0 step 3 loss" in out
    _run(train, imagenet_dir, resumed, *recipe, "--limit-steps", "2")
    _run(train, imagenet_dir, resumed, *recipe, "--limit-steps", "3", "--resume", str(resumed))
    a, b = torch.load(straight, weights_only=True), torch.load(resumed, weights_only=True)
    assert a["step"] == b["step"] == 3 and a["loader"] == b["loader"] and a["loader"]["sampler"]["repeats"] == 1
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_decoder_auto_without_engines_trains_as_the_cores(straight, imagenet_dir, tmp_path, capsys):
    """--decoder reaches the training loader: auto on a CPU (no JPEG engines to try) is decoder="cpu", so the run
    ends with the same weights as the default one, and nothing was measured."""
    path = tmp_path / "auto.pt"
    _run(_example(), imagenet_dir, path, "--limit-steps", "8", "--decoder", "auto")
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["args"]["decoder"] == "auto" and "decoder" not in ckpt["loader"]
    assert "measured" not in capsys.readouterr().out
    for name, value in straight[0]["model"].items():
        assert torch.equal(value, ckpt["model"][name]), name
    with pytest.raises(ValueError, match="decoder='nvjpeg' decodes on the GPU"):  # it is FastLoader's decoder=
        _run(_example(), imagenet_dir, tmp_path / "engines.pt", "--limit-steps", "1", "--decoder", "nvjpeg")
