"""torch.ops.fastload.batch_ops (fastload/native/batch_ops*, fastload/transforms/batch_ops.py): RandomErasing and
MixUp/CutMix in one native pass.

On real photos: the op equals the torch-op chain it replaced (tests/batch_reference.py) bit for bit, for every
erase value kind (none, scalar, per channel, "random"), mixing (none, MixUp, CutMix in modes batch/pair/elem),
dtype and layout, boxes at the borders and p = 0 / 1; the CUDA op equals the CPU op bit for bit; the pipeline
runs it once after the stage (Pipeline.run leaves the last erase to apply_batch_ops) with the same result.
"""
import numpy as np
import pytest
import torch
from PIL import Image

import fastload as fl
import fastload.transforms as T
from fastload.transforms import batch_ops
from fastload.transforms.erasing import RandomErasing
from fastload.transforms.mixing import CutMix, MixUp

import batch_reference as ref  # tests/batch_reference.py

H, W = 24, 40  # small, non-square: rows and columns cannot be swapped unnoticed
B = 13  # odd: the middle sample of pair/elem mode mixes with itself; > 8: roll mode spans two chunks on CUDA
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
VALUES = [None, 0.0, -1.5, (0.25, -2.0, 1.75), "random"]  # None: no erase
MIXES = [None] + [(cls, mode) for cls in (MixUp, CutMix) for mode in ("batch", "pair", "elem")]
CUDA = pytest.param("cuda", marks=pytest.mark.cuda)


def _photos(imagenet_dir, h, w, n):
    paths = sorted(imagenet_dir.glob("class_*/*.jpg"))[::3][:n]
    imgs = [np.asarray(Image.open(p).convert("RGB").resize((w, h), Image.BILINEAR)) for p in paths]
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float().div(255)
    return (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


@pytest.fixture(scope="module")
def photos(imagenet_dir):
    """float32 [13, 3, H, W]: real photos, normalised as the loader's output would be."""
    return _photos(imagenet_dir, H, W, B)


def _border_table(b, h, w):
    """Erase boxes touching each border and the corners, a whole image, a single pixel, and none."""
    boxes = [(0, 0, 5, 7), (h - 4, w - 9, 4, 9), (0, w - 1, h, 1), (h - 1, 0, 1, w), (0, 0, h, w), (3, 5, 1, 1),
             (0, 0, 0, 0)]
    return torch.tensor([boxes[i % len(boxes)] for i in range(b)], dtype=torch.float32)


def _border_plan(b, h, w, seed=0):
    """A CutMix/MixUp plan (lam, 1 - lam, y1, y2, x1, x2) with boxes at the borders, whole and empty."""
    lam = np.random.default_rng(seed).uniform(size=b)
    boxes = [(0, 5, 0, 7), (h - 3, h, w - 8, w), (0, h, 0, w), (4, 4, 2, 9), (2, h, 0, 1), (0, 1, 3, w)]
    plan = np.zeros((b, 6), dtype=np.float32)
    plan[:, 0], plan[:, 1] = lam, 1.0 - lam
    plan[:, 2:] = [boxes[i % len(boxes)] for i in range(b)]
    return torch.from_numpy(plan)


def _case(x, value, mix, p=0.8, table=None, plan=None):
    """(erase args or None, mix (op, plan) or None, the reference output) for batch x."""
    b, _, h, w = x.shape
    indices = np.arange(200, 200 + b)
    e = None
    if value is not None:
        e = RandomErasing(p=p, value=value, scale=(0.05, 0.4))
        e.stream = 1003
        table = e.table(4, 1, indices, h, w) if table is None else table
    op = None
    if mix is not None:
        cls, mode = mix
        op = cls(alpha=1.0, num_classes=4, mode=mode)
        op.stream = 1004
        plan = op.plan(4, 1, 6, b, h, w) if plan is None else plan
    expected = x.contiguous()  # the old chain ran on the contiguous batch
    if e is not None:
        expected = ref.erase(e, expected, table, 4, 1, indices)
    if op is not None:
        expected = ref.mix(op, expected, plan)
    return (e, table, indices), (op, plan), expected


def _fused(x, erase, mix):
    """The public paths: RandomErasing.apply alone, else apply_planned with the erase fused."""
    (e, table, indices), (op, plan) = erase, mix
    if op is None:
        return e.apply(x, table, 4, 1, indices)
    args = None if e is None else e.op_args(x, table, 4, 1, indices)
    y = torch.arange(len(x)) % 4
    return op.apply_planned(x, y.to(x.device), plan, erase=args)[0]


def _layout(x, channels_last):
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _check_layout(out, x):
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.stride() == x.stride()


# ---------------------------------------------------------------- the CPU op against the torch chain

@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mix", MIXES, ids=str)
@pytest.mark.parametrize("value", VALUES, ids=str)
def test_equals_the_torch_chain(photos, value, mix, dtype, channels_last):
    if value is None and mix is None:
        pytest.skip("nothing to do")
    x = _layout(photos.to(dtype), channels_last)
    before = x.clone()
    erase, mixing, expected = _case(x, value, mix)
    out = _fused(x, erase, mixing)
    assert torch.equal(x, before)  # x is not modified
    _check_layout(out, x)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("mix", MIXES, ids=str)
@pytest.mark.parametrize("value", [None, 0.5, "random"], ids=str)
def test_boxes_at_the_borders(photos, value, mix, channels_last):
    if value is None and mix is None:
        pytest.skip("nothing to do")
    x = _layout(photos, channels_last)
    table = _border_table(B, H, W)
    erase, mixing, expected = _case(x, value, mix, table=table, plan=_border_plan(B, H, W))
    out = _fused(x, erase, mixing)
    assert torch.equal(out, expected)
    if value == 0.5 and mix is None:  # the boxes are the slices they name
        for i, (top, left, h, w) in enumerate(table.long().tolist()):
            inside = torch.zeros(H, W, dtype=torch.bool)
            inside[top:top + h, left:left + w] = True
            assert (out[i][:, inside] == 0.5).all() and torch.equal(out[i][:, ~inside], x[i][:, ~inside])


@pytest.mark.parametrize("p", [0.0, 1.0])
@pytest.mark.parametrize("mix", [None, (MixUp, "elem"), (CutMix, "batch")], ids=str)
def test_p_zero_and_one(photos, p, mix):
    erase, mixing, expected = _case(photos, "random", mix, p=p)
    table = erase[1]
    assert bool((table[:, 2] > 0).all()) if p == 1.0 else bool((table[:, 2] == 0).all())
    out = _fused(photos, erase, mixing)
    assert torch.equal(out, expected)
    if p == 0.0 and mix is None:
        assert out is photos  # nothing erased: x itself, as before


@pytest.mark.parametrize("mix", [None, (MixUp, "batch"), (CutMix, "elem")], ids=str)
@pytest.mark.parametrize("value", VALUES[1:], ids=str)
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_batch_of_one(photos, value, mix, device):
    # A sample that is its own partner (the batch of one a loader's last batch can be) was never erased on the
    # CPU: its box was skipped as "the partner's"
    x = photos[:1]
    erase, mixing, expected = _case(x, value, mix, p=1.0)
    assert int(erase[1][0, 2]) > 0  # a box was drawn
    out = _fused(x.to(device), erase, mixing)
    assert torch.equal(out.cpu(), expected)
    assert not torch.equal(out.cpu(), x)


def _subnormal_case(photos, dtype):
    """Weights and pixels around the smallest normal float32 (Beta with a small alpha gives such lambdas):
    products and weights that are subnormal, which a flush-to-zero build would zero."""
    x = photos.clone()
    x[:, 0, :4, :4] = torch.tensor([1e-39, -3e-39, 1e-45, 2e-38])[:, None]
    lam = np.float32([1e-40, 3e-39, 1e-30, 2e-38, 0.0, 1.0, 0.5] * 2)[:B]
    plan = torch.zeros(B, 6)
    plan[:, 0] = torch.from_numpy(lam)
    plan[:, 1] = torch.from_numpy(np.float32(1.0) - lam)
    plan[::2, 0], plan[::2, 1] = plan[::2, 1].clone(), plan[::2, 0].clone()  # tiny weights on either side
    return x.to(dtype), plan


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["batch", "pair"])
def test_mixup_subnormals(photos, dtype, mode):
    x, plan = _subnormal_case(photos, dtype)
    erase, mixing, expected = _case(x, None, (MixUp, mode), plan=plan)
    out = _fused(x, erase, mixing)
    assert torch.equal(out, expected)
    if dtype == torch.float32:
        assert (out.abs() < 1.1754944e-38).logical_and(out != 0).any()  # subnormal results were made


def test_inplace_erasing_overwrites_x(photos):
    e = RandomErasing(p=1.0, value=(0.25, -2.0, 1.75), inplace=True)
    indices = np.arange(B)
    table = e.table(0, 0, indices, H, W)
    x = photos.clone()
    assert e.apply(x, table, 0, 0, indices) is x
    assert torch.equal(x, ref.erase(e, photos, table, 0, 0, indices))


def test_uint8(photos):
    """uint8: the erase value and CutMix are selects (the torch chain runs them on uint8 too); MixUp and noise
    are refused (torch has no uint8 MixUp)."""
    x = (photos * 40 + 128).clamp(0, 255).to(torch.uint8)
    e = RandomErasing(p=1.0, value=(7, 200, 31))
    op = CutMix(num_classes=4, mode="batch")
    indices = np.arange(B)
    table, plan = e.table(0, 0, indices, H, W), op.plan(0, 0, 3, B, H, W)
    columns = e.op_args(x.float(), table, 0, 0, indices)[0]
    fill = torch.tensor(e.value, dtype=torch.uint8).float().numpy()
    for channels_last in (False, True):
        xl = _layout(x, channels_last)
        out = batch_ops.run(xl, erase=(columns, fill, np.zeros(0, np.float32)), mix=op.op_args(plan))
        _check_layout(out, xl)
        assert torch.equal(out, ref.mix(op, ref.erase(e, x, table, 0, 0, indices), plan))
    with pytest.raises(RuntimeError, match="MixUp needs a float"):
        batch_ops.run(x, mix=MixUp(num_classes=4).op_args(plan))
    noise_args = RandomErasing(p=1.0, value="random").op_args(x.float(), table, 0, 0, indices)
    with pytest.raises(RuntimeError, match="noise needs a float"):
        batch_ops.run(x, erase=noise_args)


# ---------------------------------------------------------------- the op's checks and registration

def _raw(x, **kw):
    args = dict(table=torch.zeros(len(x), 11, dtype=torch.int32), fill=torch.zeros(0), noise=torch.zeros(0),
                mix=0, partner=0)
    args.update(kw)
    return torch.ops.fastload.batch_ops(x, args["table"], args["fill"], args["noise"], args["mix"], args["partner"])


def test_op_checks(photos):
    x = photos
    assert torch.equal(_raw(x), x)  # an empty table: a copy
    with pytest.raises(RuntimeError, match=r"\[B, C, H, W\]"):
        _raw(x[0])
    with pytest.raises(RuntimeError, match="float32, float16, bfloat16 or uint8"):
        _raw(x.double())
    with pytest.raises(RuntimeError, match="contiguous"):
        _raw(x[:, :, :, ::2])
    with pytest.raises(RuntimeError, match="table"):
        _raw(x, table=torch.zeros(len(x) - 1, 11, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="table"):
        _raw(x, table=torch.zeros(len(x), 11))
    with pytest.raises(RuntimeError, match="fill"):
        _raw(x, fill=torch.zeros(2))
    with pytest.raises(RuntimeError, match="mix must be"):
        _raw(x, mix=3)
    with pytest.raises(RuntimeError, match="partner must be"):
        _raw(x, partner=2)
    huge = torch.empty(1, 3, 1, 2 ** 30, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="too large"):
        _raw(huge)
    # noise beyond the tensor given, or a negative box: refused before any pixel is written
    table = torch.zeros(len(x), 11, dtype=torch.int32)
    table[2, :5] = torch.tensor([1, 2, 3, 4, 10])
    with pytest.raises(RuntimeError, match="sample 2: noise values 10..46 are outside the 40 given"):
        _raw(x, table=table, noise=torch.zeros(40))
    assert torch.equal(_raw(x, table=table, noise=torch.zeros(46))[2, :, 1:4, 2:6], torch.zeros(3, 3, 4))
    table[2, 2] = -1
    with pytest.raises(RuntimeError, match="negative erase box"):
        _raw(x, table=table, noise=torch.zeros(46))
    # sides near 2^31: the noise count (C*h*w) wrapped and passed the check; top + height wrapped in the erase
    table[2, 2:4] = 2 ** 31 - 1
    with pytest.raises(RuntimeError, match="sample 2: an erase box of 2147483647 x 2147483647 has more noise"):
        _raw(x, table=table, noise=torch.zeros(40))
    table[2, :5] = torch.tensor([10, 5, 2 ** 31 - 1, 2 ** 31 - 1, 0])
    out = _raw(x, table=table, fill=torch.full((3,), -1.0))
    assert torch.equal(out[2, :, 10:, 5:], torch.full((3, H - 10, W - 5), -1.0))
    assert torch.equal(out[2, :, :10], x[2, :, :10]) and torch.equal(out[2, :, :, :5], x[2, :, :, :5])


def _opcheck_cases(x):
    b = len(x)
    e = RandomErasing(p=0.9, value="random")
    table = e.table(0, 0, np.arange(b), *x.shape[-2:])
    erase = e.op_args(x, table, 0, 0, np.arange(b))
    mix = CutMix(num_classes=4, mode="pair").op_args(CutMix(num_classes=4, mode="pair").plan(0, 0, 1, b, *x.shape[-2:]))
    cases = []
    for m, partner in ((1, 0), (2, 1), (0, 0)):
        t = np.zeros((b, 11), dtype=np.int32)
        t[:, :5], t[:, 5:] = erase[0], mix[2]
        cases.append((x, torch.from_numpy(t).to(x.device), torch.zeros(0, device=x.device),
                      torch.from_numpy(erase[2]).to(x.device), m, partner))
    return cases


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_opcheck(photos, device):
    for x in (photos.to(device), _layout(photos.to(device, torch.bfloat16), True)):
        for args in _opcheck_cases(x):
            torch.library.opcheck(torch.ops.fastload.batch_ops.default, args)


# ---------------------------------------------------------------- the pipeline: erase + mix once after the stage

@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("photometric", [False, True], ids=["plain", "policy"])
@pytest.mark.parametrize("mixer", ["mixup", "cutmix", "choice", "none"])
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_pipeline_runs_erase_and_mix_as_the_chain(imagenet_dir, device, mixer, photometric, channels_last):
    """The stage then the batch ops, on the CPU or the GPU, against the same stage without erasing and mixing on
    the same device followed by the old chain on the CPU (the batch ops are bit for bit the same on both devices;
    the warp is not: the CUDA kernel's weights are fixed-point, test_pipeline bounds that difference)."""
    ds = fl.FolderDataset(imagenet_dir)
    stem = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]
    stem += [T.TrivialAugmentWide()] if photometric else []
    stem += [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]
    erasing = [T.RandomErasing(p=0.6, value=0.5), T.RandomErasing(p=0.9, value="random")]
    mixing = {"mixup": [T.MixUp(alpha=0.5, num_classes=4, mode="elem")],
              "cutmix": [T.CutMix(alpha=1.0, num_classes=4, mode="batch")],
              "choice": [T.RandomChoice([T.MixUp(alpha=0.2, num_classes=4), T.CutMix(alpha=1.0, num_classes=4)])],
              "none": []}[mixer]
    pipeline = T.Pipeline.build(T.Compose(stem + erasing + mixing))
    plain = T.Pipeline.build(T.Compose(stem))  # the same stage without erasing and mixing (same streams)
    idx = np.arange(11)
    plan = pipeline.plan(np.asarray(ds.heights)[idx], np.asarray(ds.widths)[idx], 3, 0, idx)
    with ds.reader() as r:
        data, offsets, shapes, status, _ = fl.ops.decode_crops([r.get(int(i)) for i in idx], plan.windows)
    assert int(status.abs().sum()) == 0
    params = pipeline.sample_params(3, 0, idx)
    stage = tuple(t.to(device) for t in (data, offsets, shapes, plan.matrices))
    x0 = plain.run(*stage, plain.sample_params(3, 0, idx)).cpu()
    expected = x0
    for e, boxes in zip(pipeline.erasing, params.erase):
        expected = ref.erase(e, expected, boxes, 3, 0, idx)
    x = pipeline.run(*stage, params, channels_last=channels_last)
    assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    y = torch.from_numpy(np.asarray(ds.labels)[idx])
    if mixing:
        for k in range(4):  # RandomChoice: both picks among these batches
            batch_plan = pipeline.batch_plan(3, 0, k, len(idx))
            op, plan = pipeline.batch_ops[0], batch_plan[0]
            if mixer == "choice":
                op, plan = op.transforms[plan[0]], plan[1]
            out, _ = pipeline.apply_batch_ops(x, y, batch_plan, params)
            assert torch.equal(out.cpu(), ref.mix(op, expected, plan))
        if mixer == "choice":
            assert {pipeline.batch_plan(3, 0, k, len(idx))[0][0] for k in range(4)} == {0, 1}
    else:
        assert torch.equal(x.cpu(), expected)


# ---------------------------------------------------------------- CUDA: bit for bit the CPU op

@pytest.mark.cuda
@pytest.mark.parametrize("size", [(H, W), (1, 1), (7, 5), (176, 176)], ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mix", MIXES, ids=str)
@pytest.mark.parametrize("value", VALUES, ids=str)
def test_cuda_equals_cpu(imagenet_dir, photos, value, mix, dtype, channels_last, size):
    if value is None and mix is None:
        pytest.skip("nothing to do")
    x = photos if size == (H, W) else _photos(imagenet_dir, *size, 18)  # 18: roll mode's last chunk is short
    x = _layout(x.to(dtype), channels_last)
    erase, mixing, expected = _case(x, value, mix, p=1.0)
    cpu = _fused(x, erase, mixing)
    assert torch.equal(cpu, expected)
    out = _fused(x.cuda(), erase, mixing)
    _check_layout(out, x.cuda())
    assert torch.equal(out.cpu(), cpu)


@pytest.mark.cuda
@pytest.mark.parametrize("mix", MIXES[1:], ids=str)
def test_cuda_unaligned_and_borders(photos, mix):
    """A batch view at an odd offset (the one-value path) and boxes at the borders."""
    base = torch.empty(photos.numel() + 1).cuda()
    x = base[1:].view(photos.shape).copy_(photos.cuda())
    erase, mixing, _ = _case(photos, "random", mix, table=_border_table(B, H, W), plan=_border_plan(B, H, W))
    assert torch.equal(_fused(x, erase, mixing).cpu(), _fused(photos, erase, mixing))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["batch", "pair"])
def test_cuda_mixup_subnormals(photos, dtype, mode):
    """No flush to zero on CUDA (the extension is built with --use_fast_math)."""
    x, plan = _subnormal_case(photos, dtype)
    erase, mixing, _ = _case(x, None, (MixUp, mode), plan=plan)
    assert torch.equal(_fused(x.cuda(), erase, mixing).cpu(), _fused(x, erase, mixing))


@pytest.mark.cuda
def test_cuda_uint8(photos):
    x = (photos * 40 + 128).clamp(0, 255).to(torch.uint8)
    op = CutMix(num_classes=4, mode="elem")
    columns = _border_table(B, H, W).numpy().astype(np.int32)
    erase = (np.concatenate([columns, np.zeros((B, 1), np.int32)], 1), np.float32([7, 200, 31]), np.zeros(0))
    mix = op.op_args(_border_plan(B, H, W))
    for channels_last in (False, True):
        xl = _layout(x, channels_last)
        assert torch.equal(batch_ops.run(xl.cuda(), erase=erase, mix=mix).cpu(), batch_ops.run(xl, erase=erase,
                                                                                                 mix=mix))
