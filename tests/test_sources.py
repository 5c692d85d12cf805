"""What FastLoader accepts as a dataset (fastload/datasets/source.py): fastload datasets, Subset and random_split of
them, protocol objects; and the messages for what it cannot read (torchvision ImageFolder, a (bytes, label)
Dataset, a dataset with transforms it would not apply)."""
import io
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload as fl
from fastload.errors import DecodeError
from fastload.datasets import FolderDataset, pack
from fastload.datasets.source import SubsetSource, as_source
from pack_corpus import photo_tree


@pytest.fixture(scope="module")
def tree(imagenet_dir, tmp_path_factory):
    return photo_tree(imagenet_dir, tmp_path_factory.mktemp("src") / "photos")


@pytest.fixture(scope="module")
def folder(tree):
    return FolderDataset(tree)


@pytest.fixture(scope="module")
def store(tree, tmp_path_factory):
    return fl.LMDBDataset(pack(tree, tmp_path_factory.mktemp("store") / "s.lmdb", progress=False,
                               log=lambda m: None).path)


def epoch(dataset, **kw):
    """Every batch of one unshuffled epoch, concatenated: (images, labels)."""
    loader = fl.FastLoader(dataset, batch_size=8, shuffle=False, crop=fl.CenterCrop(48), threads=2, **kw)
    xs, ys = zip(*loader)
    return torch.cat(xs), torch.cat(ys)


def same_files(ds, indices, tmp_path):
    """A FolderDataset over exactly the files ds.paths[indices] (a file list, labels as integers): the reference
    a Subset view must equal pixel for pixel, since crops are a function of (seed, epoch, position, size)."""
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"{Path(ds.paths[i]).relative_to(ds.root)} {ds.labels[i]}\n" for i in indices))
    return FolderDataset(ds.root, file_list=lst)


def test_fastload_datasets_pass_through(folder, store):
    assert as_source(folder) is folder and as_source(store) is store


def test_subset_loads_its_samples_and_labels(folder, tmp_path):
    idx = [40, 3, 17, 17, 0, 48, 25, 9, 31, 12, 5]  # out of order, a repeat, the PNG (12: class_01's coffee.png)
    sub = torch.utils.data.Subset(folder, idx)
    view = as_source(sub)
    assert isinstance(view, SubsetSource) and len(view) == len(idx)
    assert view.labels.tolist() == folder.labels[idx].tolist()
    assert view.sample_name(1) == folder.paths[3]
    with view.reader() as r:
        assert bytes(r.get(0)) == Path(folder.paths[40]).read_bytes()
        assert r.sources([2, 9])[0] == [folder.paths[17], folder.paths[12]]
    assert folder.paths[12].endswith("coffee.png") and view.formats[9] == 1
    x, y = epoch(sub)
    ref_x, ref_y = epoch(same_files(folder, idx, tmp_path))
    assert y.tolist() == folder.labels[idx].tolist() == ref_y.tolist()
    assert torch.equal(x, ref_x)


def test_random_split_and_nested_subsets_of_a_store(store, folder, tmp_path):
    train, val = torch.utils.data.random_split(store, [0.75, 0.25], generator=torch.Generator().manual_seed(1))
    nested = torch.utils.data.Subset(val, [-1, 0, 2])  # negative indices count from the end, as Subset's do
    want = [val.indices[-1], val.indices[0], val.indices[2]]
    view = as_source(nested)
    assert view.base is store and view.indices.tolist() == want
    assert view.sample_name(0) == store.sample_name(want[0]) == f"{store.path}[{want[0]}] (from {folder.paths[want[0]]})"
    for part in (train, val, nested):
        indices = part.indices if part is not nested else want
        x, y = epoch(part)
        # The store's record i is the folder's file i (same listing order): the same pixels, the same labels.
        ref_x, ref_y = epoch(same_files(folder, indices, tmp_path))
        assert y.tolist() == store.labels[indices].tolist() == ref_y.tolist()
        assert torch.equal(x, ref_x)


def test_subset_index_out_of_range_names_it(folder):
    with pytest.raises(IndexError, match=f"Subset index 49 is out of range for its dataset of {len(folder)}"):
        fl.FastLoader(torch.utils.data.Subset(folder, [0, 49]))


def test_torchvision_imagefolder_is_refused_with_the_way_to_adapt(tree):
    from torchvision.datasets import ImageFolder

    with pytest.raises(TypeError) as e:
        fl.FastLoader(ImageFolder(tree))
    msg = str(e.value)
    assert "torchvision.datasets.folder.ImageFolder" in msg and "heights" in msg
    assert f"fastload.FolderDataset({str(tree)!r})" in msg and "Custom datasets" in msg


def test_bytes_dataset_is_refused_with_the_protocol(folder):
    class Encoded(torch.utils.data.Dataset):
        def __len__(self):
            return len(folder)

        def __getitem__(self, i):
            return Path(folder.paths[i]).read_bytes(), int(folder.labels[i])

    with pytest.raises(TypeError) as e:
        fl.FastLoader(Encoded())
    msg = str(e.value)
    assert "Encoded" in msg and "heights, widths, labels, formats, reader, sample_name" in msg
    assert "reader().get(i)" in msg and "read_header" in msg
    with pytest.raises(TypeError, match="FastLoader cannot read a list"):
        fl.FastLoader([b"\xff\xd8", b"\xff\xd8"])


def protocol_dataset(folder, name, get):
    """The protocol's minimum over ``folder``'s index (no sources(), no classes: the loader needs neither), its
    reader's get(i) being ``get(i)``; samples named ``name[i]``."""
    import contextlib
    import types

    class Minimal:
        heights, widths, labels, formats = folder.heights, folder.widths, folder.labels, folder.formats

        def __len__(self):
            return len(folder)

        def sample_name(self, i):
            return f"{name}[{i}]"

        def reader(self):
            return contextlib.nullcontext(types.SimpleNamespace(get=get))
    return Minimal()


def test_a_protocol_object_loads(folder):
    """The protocol's minimum (no sources(): the loader reads bytes with get()) gives the dataset's own batches."""
    minimal = protocol_dataset(folder, "minimal", lambda i: Path(folder.paths[i]).read_bytes())
    x, y = epoch(minimal)
    ref_x, ref_y = epoch(folder)
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
    bad = protocol_dataset(folder, "minimal", lambda i: Path(folder.paths[i]).read_bytes())
    bad.labels = folder.labels[:-1]
    with pytest.raises(ValueError, match=f"labels has {len(folder) - 1} entries but the dataset has {len(folder)}"):
        fl.FastLoader(bad)


def test_a_protocol_readers_own_error_is_the_samples_error(folder):
    """What a protocol dataset's get() raises (an OSError from a network file system) names the sample and is
    subject to on_error like a failed decode: raised by default, skipped with on_error="skip"."""
    def get(i):
        if i == 3:
            raise OSError(5, "Input/output error")
        return Path(folder.paths[i]).read_bytes()

    Flaky = lambda: protocol_dataset(folder, "flaky", get)  # noqa: E731

    with pytest.raises(DecodeError, match=r"flaky\[3\].*OSError.*Input/output error"):
        epoch(Flaky())
    loader = fl.FastLoader(Flaky(), batch_size=8, shuffle=False, crop=fl.CenterCrop(48), threads=2, on_error="skip")
    x, y = (torch.cat(t) for t in zip(*loader))
    ref_x, ref_y = epoch(folder)
    keep = [i for i in range(len(folder)) if i != 3]  # sample 3 is replaced by another one
    assert loader.stats()["skipped"] == 1 and len(y) == len(folder)
    assert torch.equal(y[keep], ref_y[keep]) and torch.equal(x[keep], ref_x[keep])


def test_a_readers_error_through_a_subset_or_repeats_is_still_the_samples_error(folder):
    """The Subset view and repeats= read through fastload's own view of the dataset: a get() that raises there is
    that sample's error too, named and subject to on_error (it escaped as the raw KeyError)."""
    def get(i):
        if i == 3:
            raise KeyError(f"no record {i}")
        return Path(folder.paths[i]).read_bytes()

    for view, kw in ((lambda d: torch.utils.data.Subset(d, list(range(len(folder)))), {}), (lambda d: d,
                                                                                         dict(repeats=2))):
        with pytest.raises(DecodeError, match=r"flaky\[3\].*KeyError.*no record 3"):
            epoch(view(protocol_dataset(folder, "flaky", get)), **kw)
        loader = fl.FastLoader(view(protocol_dataset(folder, "flaky", get)), batch_size=8, shuffle=False,
                               crop=fl.CenterCrop(48), threads=2, on_error="skip", **kw)
        assert sum(len(y) for _, y in loader) == len(loader.sampler) and loader.stats()["skipped"] >= 1


def test_an_index_that_does_not_describe_its_files_is_the_samples_error(folder):
    """heights/widths of other images (the originals, beside resized files) would crop the wrong part of each file
    without a word from libjpeg: each JPEG's header is compared with the index on its first read, and a mismatch
    is that sample's error, named, and skipped with on_error="skip"."""
    read = lambda i: Path(folder.paths[i]).read_bytes()  # noqa: E731
    for k, change in ((2, lambda h: h // 2), (5, lambda h: h + 1)):  # smaller or larger than the file
        wrong = protocol_dataset(folder, "resized", read)
        wrong.heights = folder.heights.copy()
        wrong.heights[k] = change(wrong.heights[k])
        with pytest.raises(DecodeError, match=rf"resized\[{k}\]: its JPEG is {folder.heights[k]}x{folder.widths[k]} "
                                              rf"\(height x width\) but the dataset's heights/widths say "
                                              rf"{wrong.heights[k]}x{folder.widths[k]}"):
            epoch(wrong)
        loader = fl.FastLoader(wrong, batch_size=8, shuffle=False, crop=fl.CenterCrop(48), threads=2,
                               on_error="skip")
        x, y = (torch.cat(t) for t in zip(*loader))
        ref_x, ref_y = epoch(folder)
        keep = [i for i in range(len(folder)) if i != k]
        assert loader.stats()["skipped"] == 1 and torch.equal(x[keep], ref_x[keep])


def test_a_folder_file_replaced_by_a_larger_image_is_the_samples_error(tree, tmp_path):
    """FolderDataset's sizes come from its scan. A file replaced afterwards by a larger image (same name: a
    re-download, an edit) still fits every window planned from the old size, which would crop the wrong part
    without a word. Every decode compares the header with the index: the sample's error, naming both sizes, in the
    same loader's next epoch (after the sample passed its checks) and in a new loader, for a plain file and for one
    with restart markers (the region path)."""
    root = tmp_path / "photos"
    shutil.copytree(tree, root)
    ds = FolderDataset(root, cache=False)
    k = 3
    path = Path(ds.paths[k])
    h, w = int(ds.heights[k]), int(ds.widths[k])
    buf = io.BytesIO()
    with Image.open(path) as im:
        im.convert("RGB").resize((w + 64, h + 48)).save(buf, "JPEG", quality=90)
    larger = buf.getvalue()
    loader = fl.FastLoader(ds, batch_size=8, shuffle=False, crop=fl.CenterCrop(48), threads=2)
    assert sum(len(y) for _, y in loader) == len(ds)  # every sample decoded (and checked) once as it was
    said = (rf"{re.escape(ds.sample_name(k))}: its JPEG is {h + 48}x{w + 64} \(height x width\) but the dataset's "
            rf"heights/widths say {h}x{w}")
    for data in (larger, fl.ops.add_restart_markers(larger)):
        path.write_bytes(data)
        with pytest.raises(DecodeError, match=said):
            for _ in range(2):  # the next epoch's first batches may have been made already, before the change
                list(loader)
        with pytest.raises(DecodeError, match=said):
            epoch(ds)
        skipping = fl.FastLoader(ds, batch_size=8, shuffle=False, crop=fl.CenterCrop(48), threads=2, on_error="skip")
        assert sum(len(y) for _, y in skipping) == len(ds) and skipping.stats()["skipped"] == 1


def test_an_index_over_the_pixel_limit_is_the_samples_error_and_allocates_nothing(folder, tmp_path):
    """Buffers are sized from the plan, and the plan from the index, before any header is read: an index claiming
    10^7 x 10^7 pixels tried to allocate terabytes (a RuntimeError from the allocator, not the sample's error). A
    sample whose index is over max_pixels is now never planned from that size: the sample's error, named, and
    skipped with on_error="skip", for a JPEG (the crop decoder) and a PNG (Pillow's path) alike."""
    from PIL import Image
    png = tmp_path / "0.png"
    Image.open(folder.paths[0]).convert("RGB").save(png)
    read = lambda i: png.read_bytes() if i == 0 else Path(folder.paths[i]).read_bytes()  # noqa: E731
    engines = ((fl.RandomResizedCrop(48), dict(device="cuda", decoder="nvjpeg")),) \
        if fl.nvjpeg.available()[0] else ()  # the engines' path too, where the GPU has them
    assert len(folder) > 20
    for k in (0, 4, 20):  # the PNG, a JPEG beside it, a JPEG in a batch of JPEGs only
        huge = protocol_dataset(folder, "huge", read)
        huge.formats = folder.formats.copy()
        huge.formats[0] = 1
        huge.heights, huge.widths = folder.heights.copy(), folder.widths.copy()
        huge.heights[k], huge.widths[k] = 10**7, 10**7
        reason = (r"its image is \d+x\d+ \(height x width\) but the dataset's heights/widths say 10000000x10000000"
                  if k == 0 else r"the dataset's heights/widths say 10000000x10000000 \(height x width\), over the "
                                 rf"pixel limit \({fl.ops.MAX_PIXELS}\): not decoded")
        for crop, gpu in ((fl.CenterCrop(48), {}), (fl.RandomResizedCrop(48), {})) + engines:
            with pytest.raises(DecodeError, match=rf"huge\[{k}\]: {reason}"):
                list(fl.FastLoader(huge, batch_size=8, shuffle=False, crop=crop, threads=2, **gpu))
            loader = fl.FastLoader(huge, batch_size=8, shuffle=False, crop=crop, threads=2, on_error="skip", **gpu)
            assert sum(len(y) for _, y in loader) == len(folder) and loader.stats()["skipped"] == 1


def _first_8_indexed_12000(folder, get, formats):
    """``folder``'s index over ``get``'s bytes, its first 8 samples indexed 12000 x 12000 (under max_pixels, wrong)."""
    wrong = protocol_dataset(folder, "wrong", get)
    wrong.heights, wrong.widths, wrong.formats = folder.heights.copy(), folder.widths.copy(), formats
    wrong.heights[:8], wrong.widths[:8] = 12000, 12000
    return wrong


def _make_first_8(dataset, on_error, **decoder):
    """(batch, slot) of BatchMaker making samples 0-7 at 48 px, crops at full resolution (``decoder``: BatchMaker's
    device= and decoder=)."""
    from fastload.loader import LoaderStats
    from fastload.producer import BatchMaker, Slot
    from fastload.transforms.pipeline import Pipeline
    pipeline = Pipeline.shorthand(fl.RandomResizedCrop(48, dct_downscale=False), None, None, 1.0 / 255, torch.float32)
    pipeline.set_epoch_size(0, (48, 48))
    slot = Slot(pin=bool(decoder))
    return BatchMaker(dataset, pipeline, 0, 2, on_error, True, fl.ops.MAX_PIXELS, LoaderStats(), **decoder).make(
        np.arange(8), 0, slot), slot


def _assert_replaced_in_a_small_buffer(folder, batch, slot):
    assert batch.counts["skipped"] == 8 and not set(batch.indices.tolist()) & set(range(8))
    largest = int((folder.heights * folder.widths).max()) * 3
    assert slot.buffer.numel() < 8 * largest * 1.25 + 100  # the replacements' windows: whole images at most


def test_a_wrong_index_under_the_limit_sizes_no_buffer_from_it(folder):
    """A JPEG whose index is wrong but under max_pixels (12000 x 12000 for a photo of ~500 x 375): its header is read
    before the batch's buffer is sized, so the buffer holds the replacements' crops, not 8 windows of up to 432 MB
    each at full resolution."""
    wrong = _first_8_indexed_12000(folder, lambda i: Path(folder.paths[i]).read_bytes(), folder.formats)
    _assert_replaced_in_a_small_buffer(folder, *_make_first_8(wrong, "skip"))


@pytest.mark.cuda
def test_a_wrong_index_sizes_no_device_buffer_from_it_on_the_engines(folder):
    """The JPEG engines size their device buffer for the whole batch at full resolution; a wrong index (12000 x 12000
    under max_pixels) on 4 of the 8 samples, which the cores then replace, sizes none of it (it asked for hundreds
    of megabytes: a CUDA out-of-memory error instead of the samples' own on a big batch)."""
    if not fl.nvjpeg.available()[0]:
        pytest.skip("needs a GPU with a hardware JPEG decoder")
    wrong = _first_8_indexed_12000(folder, lambda i: Path(folder.paths[i]).read_bytes(), folder.formats)
    wrong.heights[4:8], wrong.widths[4:8] = folder.heights[4:8], folder.widths[4:8]  # right: for the engines
    cuda = dict(device=torch.device("cuda"), decoder="nvjpeg")
    batch, slot = _make_first_8(wrong, "skip", **cuda)
    assert batch.counts["skipped"] == 4 and batch.counts["gpu_decoded"] >= 1
    largest = int((folder.heights * folder.widths).max()) * 3  # whole images at most, in a power of two
    assert slot.device_buffer.numel() <= 1 << max(20, int(8 * largest * 1.25).bit_length())
    with pytest.raises(DecodeError, match=r"wrong\[0\]: its JPEG is \d+x\d+ \(height x width\) but the dataset's "
                                          r"heights/widths say 12000x12000"):
        _make_first_8(wrong, "raise", **cuda)


def test_a_wrong_index_of_other_formats_sizes_no_buffer_from_it(folder, tmp_path):
    """The same for Pillow's path: 8 PNGs indexed 12000 x 12000 are read and their headers compared before the
    buffer is sized (and before a replacement's room is)."""
    from PIL import Image
    files = []
    for i in range(len(folder)):
        files.append(tmp_path / f"{i}.png")
        Image.open(folder.paths[i]).convert("RGB").save(files[-1])
    wrong = _first_8_indexed_12000(folder, lambda i: files[i].read_bytes(), np.ones(len(folder), dtype=np.uint8))
    _assert_replaced_in_a_small_buffer(folder, *_make_first_8(wrong, "skip"))
    with pytest.raises(DecodeError, match=r"wrong\[0\]: its image is \d+x\d+ \(height x width\) but the dataset's "
                                          r"heights/widths say 12000x12000"):
        _make_first_8(wrong, "raise")


def test_a_datasets_own_base_and_indices_fields_are_its_own(folder):
    """Fields named like those of fastload's Subset view (base, indices) are the user's: not read as sample keys."""
    ds = protocol_dataset(folder, "mine", lambda i: Path(folder.paths[i]).read_bytes())
    ds.base, ds.indices = "s3://bucket", [f"id-{i}" for i in range(len(folder))]
    x, y = epoch(ds)
    ref_x, ref_y = epoch(folder)
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


def test_other_formats_check_the_index_and_name_read_errors_too(folder, tmp_path):
    """A PNG sample (Pillow's path): an index of another size is the sample's error (it was silently cropped when
    the index was smaller), and a get() that raises is a read error, not "Pillow could not decode it"."""
    from PIL import Image

    images = [np.asarray(Image.open(folder.paths[i]).convert("RGB"))[:60, :70] for i in range(4)]
    files = []
    for k, img in enumerate(images):
        files.append(tmp_path / f"{k}.png")
        Image.fromarray(img).save(files[-1])

    def get(i):
        if i == 3:
            raise KeyError(f"no record {i}")
        return files[i].read_bytes()

    ds = protocol_dataset(folder, "png", get)
    ds.heights, ds.widths = np.full(4, 60), np.full(4, 70)
    ds.labels, ds.formats = np.arange(4), np.ones(4, dtype=np.uint8)
    type(ds).__len__ = lambda self: 4
    with pytest.raises(DecodeError, match=r"png\[3\].*cannot read it: KeyError"):
        epoch(ds)
    ds.heights = np.array([60, 30, 60, 60])
    with pytest.raises(DecodeError, match=r"png\[1\]: its image is 60x70 \(height x width\) but the dataset's "
                                          r"heights/widths say 30x70"):
        next(iter(fl.FastLoader(ds, batch_size=3, shuffle=False, crop=fl.CenterCrop(24), threads=2)))


@pytest.mark.parametrize("field, values, words", [
    ("heights", [0, 1, 1], r"heights must hold integers in 1\.\..*sample 0 has 0"),
    ("widths", [3.0, 4.0, 5.0], r"widths must hold integers.*got float64"),
    ("formats", [0, 2, 0], r"formats must hold integers in 0\.\.1.*sample 1 has 2"),
])
def test_index_arrays_are_checked_when_the_loader_is_built(folder, field, values, words):
    ds = protocol_dataset(folder, "mine", lambda i: b"")
    ds.heights, ds.widths, ds.labels, ds.formats = np.full(3, 8), np.full(3, 8), np.zeros(3), np.zeros(3, np.uint8)
    type(ds).__len__ = lambda self: 3
    setattr(ds, field, np.asarray(values))
    with pytest.raises(ValueError, match=words):
        fl.FastLoader(ds)


def test_transforms_on_the_dataset_are_refused_not_ignored(tree, folder):
    """FolderDataset keeps transform/target_transform for ds[i]; FastLoader, which never calls ds[i], refuses them."""
    from torchvision.transforms import v2

    ds = FolderDataset(tree, transform=v2.RandomHorizontalFlip(), target_transform=lambda y: y + 1)
    assert ds[0][1] == int(folder.labels[0]) + 1  # plain ds[i] applies them
    with pytest.raises(ValueError) as e:
        fl.FastLoader(ds)
    msg = str(e.value)
    assert "transform=RandomHorizontalFlip" in msg and "target_transform=" in msg
    assert "FastLoader(transform=...)" in msg
    with pytest.raises(ValueError, match="target_transform="):  # inside a Subset too
        fl.FastLoader(torch.utils.data.Subset(FolderDataset(tree, target_transform=np.int32), [0, 1]))
