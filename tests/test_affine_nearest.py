"""fastload.ops.affine_nearest / affine_nearest_ (``fastload::affine_nearest_``, CPU and CUDA): the policies'
rotate/shear/translate as torchvision applies them (F.affine / F.rotate with NEAREST, grid_sample's nearest) to the
resized crop, checked pixel for pixel against torchvision on real photos; its layouts, fill, errors and op
registration; and the stage that runs it (a NEAREST policy's warp is the crop's, axis-aligned; its windows cover
what the gather reads)."""
import numpy as np
import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

import fastload as fl
import fastload.transforms as T
from fastload import ops
from fastload.transforms import policies as P

SIZES = [(176, 176), (150, 201)]


@pytest.fixture(scope="module")
def images(photos):
    """The real photos as uint8 CHW tensors (Pillow's decode)."""
    return [full.to(torch.uint8) for _, full in photos]


def _ties(matrix, h, w, tol=1e-3):
    """Output pixels whose source coordinate (float64) lies within tol of a rounding tie: there torchvision's
    float32 grid and the op's double coordinates may pick different neighbours."""
    i, j = np.mgrid[0:h, 0:w].astype(np.float64)
    x = matrix[0, 0] * j + matrix[0, 1] * i + matrix[0, 2]
    y = matrix[1, 0] * j + matrix[1, 1] * i + matrix[1, 2]
    return (np.abs(np.abs(x - np.floor(x)) - 0.5) < tol) | (np.abs(np.abs(y - np.floor(y)) - 0.5) < tol)


def _cases():
    """(torchvision op name, signed magnitude) covering every geometric op, both signs, and multiples of 90."""
    return [("Rotate", 12.5), ("Rotate", -30.0), ("Rotate", 90.0), ("Rotate", 135.0), ("ShearX", 0.3),
            ("ShearX", -0.99), ("ShearY", 0.45), ("TranslateX", 40.0), ("TranslateY", -17.0)]


@pytest.mark.parametrize("size", SIZES, ids=["176x176", "150x201"])
@pytest.mark.parametrize("fill", [None, 128, 127.5, [10, 128.5, 250]],
                         ids=["fill-none", "fill-128", "fill-127.5", "fill-per-channel"])
def test_equals_torchvisions_nearest_affine(images, size, fill):
    """Each geometric op of the policies, on real photos: the op's output equals torchvision's
    _apply_image_or_video_transform (what TrivialAugmentWide/RandAugment/AutoAugment call) with NEAREST, except at
    pixels whose source coordinate is within 1e-3 of a tie (few: asserted)."""
    h, w = size
    tv = v2.TrivialAugmentWide(fill=fill)
    checked = 0
    for photo in images[:3]:
        img = photo[:, :h, :w].contiguous()
        for name, magnitude in _cases():
            expected = tv._apply_image_or_video_transform(img, name, magnitude,
                                                          interpolation=v2.InterpolationMode.NEAREST, fill=tv._fill)
            matrix = P.geometric_matrices(name, [magnitude], h, w)[0]
            m = torch.from_numpy(matrix[:2]).float()
            got = ops.affine_nearest(img[None], m, fill=0 if fill is None else fill)[0]
            tie = torch.from_numpy(_ties(matrix, h, w))
            differ = (got != expected).any(0)
            assert not (differ & ~tie).any(), f"{name} {magnitude}: {int((differ & ~tie).sum())} pixels differ"
            checked += int((~tie).sum())
    # Ties are rare, except where every source coordinate is one: a multiple of 90 degrees about a centre at
    # (W - 1) / 2, (H - 1) / 2 when H - W is odd (torchvision's float32 grid then decides each pixel's neighbour).
    assert checked > (0.75 if (h - w) % 2 else 0.95) * 3 * len(_cases()) * h * w


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_per_channel_fill_is_each_channels_own(images, device):
    """fill=[a, b, c]: channel k is what the op gives that channel alone with fill k (uint8, rounded to even as
    torchvision rounds; float), in both layouts, whatever the path (the AVX2 gather, a translation's runs, the
    CUDA kernel); a fill of another length is refused."""
    x = torch.stack([p[:, :64, :80] for p in images[:4]]).to(device)
    rotations = [P.geometric_matrices("Rotate", [a], 64, 80)[0][:2] for a in (30.0, -12.5)]
    m = torch.from_numpy(np.stack(rotations + [np.array([[1, 0, 17.0], [0, 1, -9.0]]), np.full((2, 3), np.nan)]))
    m = m.float()
    fill = [10.0, 128.5, 251.0]
    for images_ in (x, x.contiguous(memory_format=torch.channels_last), x.float()):
        got = ops.affine_nearest(images_, m.to(device), fill=fill)
        for c, f in enumerate(fill):
            alone = ops.affine_nearest(images_[:, c:c + 1].contiguous(), m.to(device), fill=f)
            assert torch.equal(got[:, c:c + 1], alone), c
        assert torch.equal(got[3].flatten(1), torch.tensor([10, 128, 251] if images_.dtype == torch.uint8 else fill,
                                                           dtype=images_.dtype, device=device)[:, None].expand(3, 64 * 80))
    with pytest.raises(RuntimeError, match="fill must have 1 value or one per channel"):
        ops.affine_nearest(x, m.to(device), fill=[1.0, 2.0])
    # more channels than fill values can name (one value then): every plane's fill, the CPU's AVX2 lanes included
    x6 = torch.cat([x, x], 1)
    assert torch.equal(ops.affine_nearest(x6, m.to(device), fill=77),
                       ops.affine_nearest(x6.float(), m.to(device), fill=77).to(torch.uint8))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_layouts_dtypes_and_fill(images, device):
    """channels_last and float32 give the same pixels as NCHW uint8; the fill is rounded to even for uint8, as
    torchvision's float_img.round_().to(uint8); outside pixels are fill, and the identity copies."""
    x = torch.stack([p[:, :120, :100] for p in images[:4]]).to(device)
    m = torch.from_numpy(np.stack([P.geometric_matrices("Rotate", [a], 120, 100)[0][:2] for a in (0.0, 20, -45, 90)]))
    m = m.float().to(device)
    base = ops.affine_nearest(x, m, fill=127.5)
    assert torch.equal(base[0], x[0])  # rotate by 0: the identity
    assert (base[2] == 128).any() and base.dtype == torch.uint8  # 127.5 rounds to 128 (even)
    cl = ops.affine_nearest(x.contiguous(memory_format=torch.channels_last), m, fill=127.5)
    assert cl.is_contiguous(memory_format=torch.channels_last) and torch.equal(cl, base)
    as_float = ops.affine_nearest(x.float(), m, fill=127.5)
    outside = (base != x.float().round().to(torch.uint8)) & (as_float == 127.5)
    assert torch.equal(as_float.round().to(torch.uint8)[~outside], base[~outside])
    assert (as_float == 127.5).any()
    assert torch.equal(ops.affine_nearest(x[:1], m[0].cpu(), fill=0)[0], x[0])  # a [2, 3] matrix broadcasts


def test_bad_arguments_are_refused(images):
    x = images[0][None, :, :64, :64].contiguous()
    m = torch.zeros(1, 2, 3)
    op = torch.ops.fastload.affine_nearest_
    with pytest.raises(ValueError, match="4-D"):
        ops.affine_nearest(x[0], m)
    with pytest.raises(ValueError, match=r"\[N, 2, 3\]"):
        ops.affine_nearest(x, torch.zeros(2, 2, 3))
    with pytest.raises(RuntimeError, match="uint8 or float32"):
        ops.affine_nearest(x.to(torch.int16), m)
    with pytest.raises(RuntimeError, match="contiguous"):
        op(x[:, :, ::2], torch.zeros(1, dtype=torch.int64), m, [0.0])
    with pytest.raises(RuntimeError, match="float32"):
        op(x, torch.zeros(1, dtype=torch.int64), m.double(), [0.0])
    with pytest.raises(RuntimeError, match="int64"):
        op(x, torch.zeros(1, dtype=torch.int32), m, [0.0])
    # sample indices: checked by the wrapper on the host, and by the CPU kernel itself
    for samples, words in (([1], "index the batch"), ([-1], "index the batch")):
        with pytest.raises(ValueError, match=words):
            ops.affine_nearest_(x, samples, m)
    with pytest.raises(ValueError, match="distinct"):
        ops.affine_nearest_(torch.cat([x, x]), [1, 1], torch.zeros(2, 2, 3))
    with pytest.raises(RuntimeError, match="out of range"):
        op(x, torch.tensor([3]), m, [0.0])
    with pytest.raises(RuntimeError, match="listed twice"):
        op(torch.cat([x, x]), torch.tensor([0, 0]), torch.zeros(2, 2, 3), [0.0])
    # a non-finite matrix reads nothing: every pixel is fill
    assert (ops.affine_nearest(x, torch.full((1, 2, 3), float("nan")), fill=7) == 7).all()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_in_place_on_the_listed_samples_only(images, device):
    """affine_nearest_ changes the listed samples as affine_nearest does and leaves the others' bytes alone."""
    x = torch.stack([p[:, :96, :80] for p in images[:4]]).to(device)
    m = torch.from_numpy(np.stack([P.geometric_matrices(n, [g], 96, 80)[0][:2]
                                   for n, g in (("Rotate", 25.0), ("ShearY", -0.4))])).float()
    y = x.clone()
    ops.affine_nearest_(y, torch.tensor([3, 1]), m, 5)
    assert torch.equal(y[[0, 2]], x[[0, 2]])
    assert torch.equal(y[[3, 1]], ops.affine_nearest(x[[3, 1]], m, 5))
    assert not torch.equal(y[3], x[3])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_opcheck(images, device):
    x = torch.stack([p[:, :40, :52] for p in images[:3]]).to(device)
    m = torch.from_numpy(np.stack([P.geometric_matrices("ShearX", [s], 40, 52)[0][:2] for s in (0.1, -0.5)]))
    samples = torch.tensor([2, 0], device=device)
    for batch in (x, x.float(), x.contiguous(memory_format=torch.channels_last)):
        torch.library.opcheck(torch.ops.fastload.affine_nearest_.default,
                              (batch.clone(), samples, m.float().to(device), [3.0]))


@pytest.mark.cuda
def test_cuda_equals_cpu_bit_for_bit(images):
    """The same pixel on both devices, ties included (affine_nearest.h: double coordinates, no fma)."""
    x = torch.stack([p[:, :176, :176] for p in images[:4]] * 2)
    names = ["Rotate", "ShearX", "ShearY", "TranslateX", "Rotate", "ShearY", "Rotate", "ShearX"]
    mags = [33.3, 0.2, -0.7, 55.0, -135.0, 1 / 15, 7.0, -0.25]
    m = torch.from_numpy(np.stack([P.geometric_matrices(n, [g], 176, 176)[0][:2] for n, g in zip(names, mags)]))
    m = m.float()
    m[7, 1, 2] = float("nan")  # every pixel fill
    m[6] *= 3.0  # a zoom out: the tile's sources do not fit the CUDA kernel's staging (it reads global memory)
    for images in (x, x.float(), x.contiguous(memory_format=torch.channels_last)):
        got = ops.affine_nearest(images.cuda(), m.cuda(), 9.0).cpu()
        assert torch.equal(got, ops.affine_nearest(images, m, 9.0))
        assert (got[7] == 9).all()


def _pipeline(interpolation, size=64):
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
                      T.TrivialAugmentWide(interpolation=interpolation), T.ToDtype(torch.float32, scale=True)])


def test_nearest_policy_decodes_the_crop_and_gathers_after_the_warp(imagenet_dir):
    """With NEAREST (the default) the policy's geometry is torchvision's: the decode windows and warp matrices are
    the crop's (the pipeline without the policy: every warp axis-aligned), and the samples that drew a geometric op
    are gathered from the warped crop. With BILINEAR the ops still compose into the one warp (rotated matrices)."""
    ds = fl.FolderDataset(imagenet_dir)
    idx = np.arange(len(ds))
    hs, ws = np.asarray(ds.heights), np.asarray(ds.widths)
    crop_only = fl.FastLoader(ds, batch_size=16, transform=T.Compose([T.RandomResizedCrop(64),
                                                                          T.RandomHorizontalFlip()])).pipeline
    nearest = fl.FastLoader(ds, batch_size=16, transform=_pipeline("nearest")).pipeline
    bilinear = fl.FastLoader(ds, batch_size=16, transform=_pipeline("bilinear")).pipeline
    base = crop_only.plan(hs, ws, 0, 0, idx)
    plan = nearest.plan(hs, ws, 0, 0, idx)
    listed = nearest.sample_params(0, 0, idx).nearest
    samples, maps = listed.samples, listed.matrices
    assert listed.slots == [0] * len(samples)  # TrivialAugmentWide's one slot
    # the crop's warp; windows: the crop's, or for moved samples the part of it that the gather reads (a
    # translation's shifted-out part is not decoded)
    kept = np.setdiff1d(idx, samples.numpy())
    assert torch.equal(plan.matrices[:, :, :2], base.matrices[:, :, :2])
    assert torch.equal(plan.windows[:, 4], base.windows[:, 4])
    assert torch.equal(plan.windows[kept], base.windows[kept]) and torch.equal(plan.matrices[kept], base.matrices[kept])
    t, l, hh, ww = plan.windows[:, :4].T
    bt, bl, bh, bw = base.windows[:, :4].T
    assert ((t >= bt) & (l >= bl) & (t + hh <= bt + bh) & (l + ww <= bl + bw)).all()
    assert (hh * ww < bh * bw).any()
    op, magnitude, applied = nearest._policies[0].draws(0, 0, idx, 64, 64)
    names = np.array(nearest._policies[0].op_names)[op[:, 0]]
    moved = np.isin(names, ["Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"]) & (magnitude[:, 0] != 0)
    assert np.array_equal(samples.numpy(), np.flatnonzero(moved)) and maps.shape == (int(moved.sum()), 2, 3)
    rotated = np.flatnonzero(names == "Rotate")
    composed = bilinear.plan(hs, ws, 0, 0, idx)
    assert bilinear.sample_params(0, 0, idx).nearest is None
    assert (composed.matrices[rotated, 0, 1] != 0).all()  # rotations inside the warp


@pytest.mark.parametrize("middle", [[T.TrivialAugmentWide()], [T.RandAugment(num_ops=3)],
                                    [T.ColorJitter(0.4, 0.4, 0.4), T.RandAugment()]], ids=["ta", "ra3", "jitter-ra"])
def test_the_gathered_part_is_decoded_exactly_as_the_whole_crop(imagenet_dir, middle):
    """A moved sample's window covers only what its first gather reads (plus the filter's reach), where no op
    before that gather changes pixels (else the whole crop: equalize's histogram, say, needs all of it): the batch
    equals the one made from the whole crop's window (GeometryPlanner.plan without ``read``), pixel for pixel."""
    ds = fl.FolderDataset(imagenet_dir)
    idx = np.arange(len(ds))
    hs, ws = np.asarray(ds.heights), np.asarray(ds.widths)
    pipe = fl.FastLoader(ds, batch_size=16, transform=T.Compose([
        T.RandomResizedCrop(96), *middle, T.ToDtype(torch.float32, scale=True)])).pipeline
    params = pipe.sample_params(0, 0, idx)
    narrow = pipe.plan(hs, ws, 0, 0, idx)
    whole = pipe._geometries[(96, 96)].plan(hs, ws, 0, 0, idx)
    smaller = int((narrow.windows[:, 2] * narrow.windows[:, 3] < whole.windows[:, 2] * whole.windows[:, 3]).sum())
    # ColorJitter first changes (nearly) every sample before its gather: whole crops there
    assert smaller >= 3 if middle[0].kind == "policy" else smaller == 0
    out = []
    for plan in (narrow, whole):
        with ds.reader() as r:
            data, offsets, shapes, status, _ = ops.decode_crops([r.get(int(i)) for i in idx], plan.windows)
        assert int(status.abs().sum()) == 0
        out.append(pipe.run(data, offsets, shapes, plan.matrices, params))
    assert torch.equal(out[0], out[1])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("policy, theirs", [(T.RandAugment(num_ops=3), "RandAugment(num_ops=3)"),
                                            (T.AutoAugment(), "AutoAugment()"),
                                            (T.TrivialAugmentWide(), "TrivialAugmentWide()")], ids=["ra3", "aa", "ta"])
def test_policy_ops_run_in_torchvisions_order(imagenet_dir, policy, theirs, device):
    """Each sample's ops in the order it drew them, as torchvision applies them to the resized crop: a geometric op
    moves what the ops before it made (an Invert then a Rotate fills the corners with 0, not 255) and two geometric
    ops resample twice. The loader's uint8 batch against torchvision's _apply_image_or_video_transform replayed op
    by op on the same resized crops. Allowed: pixels whose source lands on a rounding tie of a nearest map (there
    torchvision's float32 grid may pick the other neighbour). (A Color/Contrast/Sharpness factor 1 + magnitude that
    is no float32 once put AutoAugment's samples a level apart: the table now carries its 1 - factor too.)"""
    import torchvision.transforms.v2 as TV
    ds = fl.FolderDataset(imagenet_dir)
    n = len(ds)
    idx = np.arange(n)
    loader = fl.FastLoader(ds, batch_size=n, shuffle=False, device=device,
                           transform=T.Compose([T.RandomResizedCrop(64), policy]))
    x = next(iter(loader))[0].cpu()
    pipe = loader.pipeline
    hs, ws = np.asarray(ds.heights), np.asarray(ds.widths)
    plan = pipe.plan(hs, ws, 0, 0, idx)  # the loader's windows: all that each sample's first op reads
    with ds.reader() as r:
        data, offsets, shapes, status, _ = ops.decode_crops([r.get(int(i)) for i in idx], plan.windows)
    # the resized crops on the loader's device (the CUDA warp's rounding differs from the CPU's by a level here
    # and there: test_warp), then torchvision on them
    crops = ops.warp_ragged(*(t.to(device) for t in (data, offsets, shapes, plan.matrices)), 64, in_scale=1.0,
                            out_dtype=torch.uint8).cpu()
    tv = eval(f"TV.{theirs}")
    p = pipe._policies[0]
    op, magnitude, applied = p.draws(0, 0, idx, 64, 64)
    names = np.array(p.op_names)
    exact, orders = 0, set()
    for i in idx:
        image = crops[i]
        for s in range(op.shape[1]):
            if applied[i, s]:
                image = tv._apply_image_or_video_transform(image, str(names[op[i, s]]), float(magnitude[i, s]),
                                                           interpolation=tv.interpolation, fill=tv._fill)
        diff = (image.int() - x[i].int()).abs()
        exact += int(diff.max() == 0)
        assert (diff.amax(0) > 0).float().mean() < 0.02, (i, [names[op[i, s]] for s in range(op.shape[1])])
        kinds = ["g" if np.isin(names[op[i, s]], P._GEOMETRIC) else "p" for s in range(op.shape[1]) if applied[i, s]]
        orders.add("".join(kinds))
    assert exact >= 0.9 * n
    # drawn: a geometric op after a photometric one, two geometric ops (what composing every map before the first
    # slot got wrong; TrivialAugmentWide draws one op)
    assert any("pg" in o or "gg" in o for o in orders) or isinstance(policy, T.TrivialAugmentWide)
