"""The `fastload` command: pack | inspect | verify | bench (also `python -m fastload`).

One ``add_<name>(subparsers)`` function per subcommand registers its parser and sets ``func``, the function that
runs it and returns the exit code; ``SUBCOMMANDS`` lists them, so a new subcommand is one function plus one entry.
"""
import argparse
import json
import os
import re
import sys

EXIT_OK, EXIT_DATA, EXIT_USAGE = 0, 1, 2
EXIT_CODES = """exit codes:
  0  success
  1  data problems: files or records that fail to read or decode (verify; pack --on-error raise), or the command
     could not complete (an I/O error, a full disk)
  2  usage errors: bad arguments, a missing path, not a dataset, a destination in the way
  130 interrupted (Ctrl-C); an interrupted pack continues with --resume"""


_Formatter = argparse.RawDescriptionHelpFormatter


def _size(text):
    """'64G', '512M', '1T' or a byte count -> bytes (argparse type)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512M, 64G, 1T)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _human(n):
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _err(msg):
    print(f"fastload: error: {msg}", file=sys.stderr)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """warnings.showwarning for the command line: the message itself, not `cli.py:60: UserWarning:` and a source
    line that mean nothing to someone running a command."""
    text = str(message).replace(": warning: ", ": ", 1)  # a JpegWarning's "name: warning: libjpeg's text"
    print(f"fastload: warning: {text.removeprefix('warning: ')}", file=file or sys.stderr)


def _open_dataset(path, threads=None, strict=True):
    """An LMDBDataset for a store, a FolderDataset for an image folder."""
    from .datasets import FolderDataset, LMDBDataset

    path = os.path.abspath(path)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "data.mdb")) and \
            not path.endswith(".partial"):
        return FolderDataset(path, threads=threads, strict=strict)
    return LMDBDataset(path, strict=strict)


# ---------------------------------------------------------------------------------------------------- pack
def add_pack(sub):
    p = sub.add_parser(
        "pack", formatter_class=_Formatter, epilog=EXIT_CODES,
        help="pack an image folder into an LMDB store",
        description="Pack an ImageFolder tree (one sub-folder per class) into an LMDB store for LMDBDataset.\n\n"
        "Original file bytes are kept unless --seekable (lossless) or --max-side is given. Every file is\n"
        "checked: JPEGs (recognised by their bytes, not their name) by their header and marker structure\n"
        "(empty, garbage and truncated files, a few microseconds each) and, with strict checking (the default),\n"
        "an entropy decode of every scan; other formats by a Pillow decode. Unreadable or broken files are\n"
        "skipped and listed, with reasons, in the summary, in DST/report.txt and in the store's metadata\n"
        "(--on-error raise stops at the first one).\n\n"
        "Writes DST.partial and renames it to DST only when complete. An interrupted pack (Ctrl-C, a kill,\n"
        "a crash) keeps every committed batch: run the same command with --resume to continue it.")
    p.add_argument("src", metavar="SRC", help="image folder (ImageFolder layout) or, with --file-list, its root")
    p.add_argument("dst", metavar="DST", help="store to create (a directory holding data.mdb)")
    p.add_argument("--workers", type=_positive, default=None, metavar="N",
                   help="reader/checker threads (default: one per core, at most 8)")
    p.add_argument("--verify-decode", action="store_true",
                   help="also decode every JPEG's pixels while packing (IDCT and colour conversion). A strict pack "
                   "(the default) already entropy-decodes every JPEG's whole scan, which refuses damaged image data "
                   "exactly as a full decode does; this adds the pixel reconstruction, which finds nothing more "
                   "libjpeg would report. `fastload verify DST` decodes every record later")
    p.add_argument("--seekable", action="store_true",
                   help="re-encode JPEGs losslessly with restart markers (same DCT coefficients, so every decoder "
                   "gives exactly the same pixels; optimised Huffman tables; APPn/COM markers kept), so that the "
                   "loader entropy-decodes only the part of the file around each crop instead of everything above "
                   "and beside it. RandomResizedCrop decoding gets 1.1-1.35x faster on ImageNet-sized photos "
                   "(by machine) and ~1.75x on 1080p; the store is about as large (+-3%%); packing costs ~2 ms more per "
                   "ImageNet-sized file per core (~30 ms per 1080p file). Files in other colour spaces (CMYK, RGB) keep their bytes")
    p.add_argument("--max-side", type=_positive, metavar="S",
                   help="re-encode JPEGs whose longer side exceeds S pixels, resized to S (libjpeg-turbo via "
                   "PyTurboJPEG), for a smaller store; others keep their bytes")
    p.add_argument("--quality", type=int, metavar="Q", help="JPEG quality of re-encoded images (default 90)")
    p.add_argument("--convert-to-jpeg", action="store_true",
                   help="convert non-JPEG images (PNG, BMP, ...) to JPEG; by default they are stored as they are "
                   "and flagged, and decoded by Pillow when loading (slower)")
    p.add_argument("--on-error", choices=["skip", "raise"], default="skip",
                   help="skip (default): leave a broken or unreadable file out and list it; raise: it is fatal "
                   "(exit code 1)")
    p.add_argument("--no-strict", dest="strict", action="store_false",
                   help="keep JPEGs whose header libjpeg warns about in a way that may mean wrong pixels (as "
                   "FastLoader(strict=False) decodes them); by default they are skipped. Harmless warnings (junk "
                   "between markers, an odd JFIF revision) never skip a file")
    p.add_argument("--resume", action="store_true", help="continue an interrupted pack (DST.partial); with "
                   "--force, one that was replacing an existing DST")
    p.add_argument("--force", action="store_true",
                   help="replace an existing DST (removed only once the new store is complete) and, without "
                   "--resume, discard a DST.partial (never one a running pack holds); only ever deletes fastload "
                   "stores")
    p.add_argument("--map-size", type=_size, metavar="SIZE",
                   help="initial LMDB map size, e.g. 200G (default: source size + 10%%; doubled whenever full)")
    p.add_argument("--commit-every", type=_positive, default=512, metavar="N",
                   help="files per transaction, what an interruption can cost (default 512)")
    p.add_argument("--file-list", metavar="FILE",
                   help="pack exactly the files listed, one 'relative/path label' per line (paths relative to "
                   "SRC; labels integers or class names), or a CSV file whose header names path and label columns")
    p.add_argument("--classes-from", metavar="PATH",
                   help="take the class names and their label numbers from PATH: a store made by `fastload pack` "
                   "(e.g. the training set's, so a validation set missing a class keeps its numbers) or a text file "
                   "of class names, one per line (label k is line k)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="nothing on stderr but warnings and errors (no progress bar or lines, no progress "
                   "messages); the summary and the skipped files still go to stdout")
    p.set_defaults(func=cmd_pack)


def cmd_pack(args):
    from .datasets.pack import pack

    say = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr))
    result = pack(args.src, args.dst, workers=args.workers, max_side=args.max_side, quality=args.quality,
                  convert_to_jpeg=args.convert_to_jpeg, verify_decode=args.verify_decode, seekable=args.seekable,
                  strict=args.strict, on_error=args.on_error,
                  resume=args.resume, force=args.force, map_size=args.map_size, commit_every=args.commit_every,
                  file_list=args.file_list, classes=_classes_from(args.classes_from), progress=not args.quiet,
                  log=say)
    # The rate of what this run read: after --resume, the files an earlier run packed are not in it.
    done, seconds = result.files_this_run, result.seconds
    rate = f"{done / seconds:,.0f} files/s" if done and seconds > 0 else "nothing left to pack"
    resumed = f"; this run packed {done} of them" if 0 < done != result.files else ""
    print(f"packed {result.records} images from {result.files} files into {result.path} in {seconds:.1f} s "
          f"({rate}{resumed}), {_human(result.image_bytes)} of image data"
          + (f", {result.reencoded} re-encoded" if result.reencoded else "")
          + (f", {result.converted} converted to JPEG" if result.converted else "")
          + (f", {result.seekable} made seekable" if result.seekable else ""))
    if result.skipped:
        print(f"skipped {len(result.skipped)} files (all listed in {os.path.join(result.path, 'report.txt')}):")
        for path, reason in result.skipped[:20]:
            print(f"  {path}: {reason}")
        if len(result.skipped) > 20:
            print(f"  ... and {len(result.skipped) - 20} more")
    return EXIT_OK


def _classes_from(path):
    """The class names of --classes-from: a store's, or a text file's lines (blank lines and # comments skipped)."""
    if path is None:
        return None
    from .datasets.base import DatasetError
    from .datasets.folder import read_text_lines
    from .datasets.lmdb import read_meta

    if os.path.isfile(path) and not path.endswith(".mdb"):
        names = [line.strip() for line in read_text_lines(path, "--classes-from list")
                 if line.strip() and not line.lstrip().startswith("#")]
        if not names:
            raise DatasetError(f"--classes-from {path}: no class names in the file")
        return names
    return list(read_meta(path)[0]["classes"])


# ------------------------------------------------------------------------------------------------- inspect
def add_inspect(sub):
    p = sub.add_parser("inspect", formatter_class=_Formatter, epilog=EXIT_CODES,
                       help="summarise a store (or an image folder)",
                       description="Print what a store holds: count, classes and their sizes, image sizes, formats, "
                       "bytes, and the files skipped when it was packed. Reads only the metadata.")
    p.add_argument("path", metavar="DST", help="a store made by `fastload pack` (or an image folder)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--all", action="store_true", help="list every class and skipped file")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args):
    ds = _open_dataset(args.path)
    s = ds.summary()
    meta = getattr(ds, "meta", None)
    if meta is not None:
        s.update(kind="store", path=ds.path, version=meta["version"], source=meta.get("source"),
                 created=meta.get("created"), image_bytes=meta.get("image_bytes"),
                 disk_bytes=_disk_bytes(ds.path), reencoded=meta.get("reencoded", 0),
                 converted=meta.get("converted", 0), seekable=meta.get("seekable", 0),
                 files_seen=meta.get("files_seen"))
    else:
        s.update(kind="folder", path=ds.root, image_bytes=int(ds.sizes.sum()))
    if args.json:
        print(json.dumps(s, indent=2))
        return EXIT_OK
    limit = None if args.all else 20
    head = f"{s['path']}: " + (f"fastload store (format {s['version']}), packed {s['created']} from {s['source']}"
                               if meta is not None else "image folder")
    print(head)
    fmt = s["formats"]
    print(f"samples      {s['count']} ({', '.join(f'{k} {v}' for k, v in fmt.items())})")
    pairs = list(zip(s["classes"], s["class_counts"]))
    counts = s["class_counts"]
    spread = f"; {min(counts)}-{max(counts)} per class" if counts else ""
    print(f"classes      {len(pairs)}{spread}")
    for name, n in pairs[:limit]:
        print(f"  {n:>9}  {name}")
    if limit is not None and len(pairs) > limit:
        print(f"  ... {len(pairs) - limit} more (--all lists them)")
    for key in ("height", "width"):
        st = s[key]
        if st:
            print(f"{key:<12} min {st['min']}, median {st['median']:g}, max {st['max']}")
    if s["longer_side"]:
        print("longer side  " + ", ".join(f"{k}: {v}" for k, v in s["longer_side"].items()))
    per = s["image_bytes"] / s["count"] if s["count"] else 0
    line = f"bytes        {_human(s['image_bytes'])} of images ({_human(per)} per image)"
    if meta is not None:
        line += f", {_human(s['disk_bytes'])} on disk"
        if s["reencoded"] or s["converted"]:
            line += f"; {s['reencoded']} re-encoded, {s['converted']} converted to JPEG"
        if s["seekable"]:
            line += f"; {s['seekable']} seekable (restart markers)"
    print(line)
    skipped = s["skipped"]
    print(f"skipped      {len(skipped)}" + (" files at pack time" if meta is not None else " files unreadable"))
    for path, reason in skipped[:limit]:
        print(f"  {path}: {reason}")
    if limit is not None and len(skipped) > limit:
        print(f"  ... {len(skipped) - limit} more (--all lists them)")
    return EXIT_OK


def _disk_bytes(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return os.path.getsize(path)


# -------------------------------------------------------------------------------------------------- verify
def add_verify(sub):
    p = sub.add_parser("verify", formatter_class=_Formatter, epilog=EXIT_CODES,
                       help="decode every image of a store or folder and list failures",
                       description="Fully decode every sample (libjpeg-turbo on native threads; Pillow for other "
                       "formats) and list each one that fails, with the reason. For a store, also check every "
                       "record's checksum and header against the index. Exit code 1 if anything fails.")
    p.add_argument("path", metavar="DST|SRC", help="a store made by `fastload pack`, or an image folder")
    p.add_argument("--threads", type=_positive, default=None, metavar="N", help="decode threads (default: one per core)")
    p.add_argument("--no-strict", dest="strict", action="store_false",
                   help="accept what decodes with libjpeg warnings that may mean wrong pixels (as "
                   "FastLoader(strict=False) does); by default those files fail")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args):
    import warnings

    from .datasets.verify import verify

    from .datasets import DatasetError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a folder's unreadable files are reported below, as failures
            ds = _open_dataset(args.path, threads=args.threads, strict=args.strict)
    except DatasetError as e:
        if not getattr(e, "skipped", None):
            raise
        # a folder none of whose image files can be read: each is a failure (exit 1), as with one good file
        for name, reason in e.skipped:
            print(f"FAILED {name}: cannot be read: {reason}")
        print(f"verified {len(e.skipped)} images: 0 ok, {len(e.skipped)} failed")
        return EXIT_DATA
    failures = [(p, f"cannot be read: {r}") for p, r in ds.skipped] if not hasattr(ds, "meta") else []
    failures += verify(ds, threads=args.threads, progress=not args.quiet, strict=args.strict)
    for name, reason in failures:
        print(f"FAILED {name}: {reason}")
    total = len(ds) + (len(ds.skipped) if not hasattr(ds, "meta") else 0)
    print(f"verified {total} images: {total - len(failures)} ok, {len(failures)} failed")
    return EXIT_DATA if failures else EXIT_OK


# --------------------------------------------------------------------------------------------------- bench
def add_bench(sub):
    p = sub.add_parser(
        "bench", formatter_class=_Formatter, epilog=EXIT_CODES,
        help="measure loader throughput (and training efficiency) against torchvision",
        description="Measure how many training images per second FastLoader delivers from DATA (RandomResizedCrop,\n"
        "flip, normalise), and with --baseline torchvision the same for torchvision's ImageFolder (PIL over the\n"
        "records of a store) + DataLoader with the standard training transforms, side by side in one run.\n"
        "One warm-up epoch, then --epochs timed epochs; every number printed is measured in this run.\n\n"
        "With --model (CUDA): a real training step (torchvision model, SGD, bf16 autocast, channels_last) on a\n"
        "fixed GPU batch (the ceiling), then fed by FastLoader and by torchvision; efficiency = rate / ceiling\n"
        "answers: is my training loader-bound, and does fastload fix it?\n\n"
        "A progress bar on stderr while it runs, a table on stdout at the end.")
    p.add_argument("data", metavar="DATA", help="an image folder (ImageFolder layout) or a store made by `fastload pack`")
    p.add_argument("--baseline", choices=["torchvision"], help="also measure torchvision's DataLoader")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="where batches are delivered (default: cuda when available, else cpu)")
    p.add_argument("--batch-size", type=_positive, default=256, metavar="B", help="images per batch (default 256)")
    p.add_argument("--threads", type=_positive, default=None, metavar="N",
                   help="FastLoader decode threads per producer (default: FastLoader's: the cores shared out "
                        "among its producers)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="torchvision DataLoader worker processes (default: one per core; 0: in the main process)")
    p.add_argument("--epochs", type=_positive, default=2, metavar="E",
                   help="timed epochs per pipeline, after one warm-up epoch (default 2)")
    p.add_argument("--decoder", choices=["cpu", "nvjpeg", "hybrid", "auto"], default="cpu",
                   help="FastLoader's JPEG decoder: cpu (libjpeg-turbo crop decode, default), nvjpeg (the GPU's "
                   "hardware decoder; --device cuda), hybrid (both, on different batches; --device cuda), auto "
                   "(where the GPU has JPEG engines: after 32 batches, each decoder in turn on 40, then the fastest; "
                   "the table says what it chose and measured. Elsewhere cpu)")
    p.add_argument("--size", type=_positive, default=224, metavar="S", help="crop size (default 224)")
    p.add_argument("--transform", choices=["plain", "trivialaugment", "randaugment", "autoaugment", "torchvision_v2",
                                           "colorjitter", "threeaugment"],
                   default=None,
                   help="the same torchvision v2 pipeline in both loaders: RandomResizedCrop + RandomHorizontalFlip "
                        "+ [TrivialAugmentWide | RandAugment(2, 9) | AutoAugment | ColorJitter(0.4, 0.4, 0.4, 0.1) + "
                        "RandomGrayscale(0.2) | threeaugment: DeiT III's RandomChoice([RandomGrayscale(p=1), "
                        "RandomSolarize(128, p=1), GaussianBlur(13, (0.1, 2))]) + ColorJitter(0.3, 0.3, 0.3)] + "
                        "ToDtype + Normalize; "
                        "torchvision_v2: torchvision's reference recipe (TrivialAugmentWide, RandomErasing(0.1), "
                        "MixUp/CutMix) (default: fastload's crop= shorthand against torchvision's classic "
                        "transforms)")
    p.add_argument("--model", choices=["resnet18", "resnet50"],
                   help="measure training efficiency with this torchvision model (needs CUDA)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="with --model: capture the training step in a CUDA graph (as torch.compile's "
                        "reduce-overhead mode does), for the ceiling and every loader alike: one launch a step, so "
                        "a fast model's step does not wait for a busy host")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-': stdout, the table then "
                   "goes to stderr)")
    p.add_argument("--plot", metavar="FILE.png", help="write a bar chart of the results")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)


#: The largest --size bench accepts: crops beyond it are not what a loader benchmark is about, and a batch of 256 of
#: them would not fit in memory (--size 100000 asked for 480 GB).
MAX_BENCH_SIZE = 1024


def cmd_bench(args):
    import importlib.util

    import torch

    from . import benchmark

    cuda = torch.cuda.is_available()
    device = args.device or ("cuda" if cuda else "cpu")
    if device == "cuda" and not cuda:
        _err("--device cuda, but CUDA is not available here (torch.cuda.is_available() is False); use --device cpu")
        return EXIT_USAGE
    if args.model and not cuda:
        _err(f"--model {args.model} measures training efficiency on a GPU, and CUDA is not available here; "
             "leave --model out to measure the loaders alone")
        return EXIT_USAGE
    if args.model and device != "cuda":
        _err(f"--model {args.model} measures training efficiency on the GPU; use it with --device cuda")
        return EXIT_USAGE
    if args.cuda_graph and not args.model:
        _err("--cuda-graph captures a model's training step: it needs --model")
        return EXIT_USAGE
    if args.workers is not None and args.workers < 0:
        _err(f"--workers must be 0 or more, got {args.workers}")
        return EXIT_USAGE
    if args.decoder in ("nvjpeg", "hybrid") and device != "cuda":
        _err(f"--decoder {args.decoder} decodes on the GPU; use it with --device cuda")
        return EXIT_USAGE
    needs = [("torchvision", "--baseline torchvision" if args.baseline else "--model")] \
        if args.baseline or args.model else []
    needs += [("matplotlib", "--plot")] if args.plot else []
    for module, option in needs:
        if importlib.util.find_spec(module) is None:
            _err(f"{option} needs {module}: pip install {module}")
            return EXIT_USAGE
    if args.size > MAX_BENCH_SIZE:
        _err(f"--size {args.size} is larger than fastload bench measures (at most {MAX_BENCH_SIZE} px: training crops)")
        return EXIT_USAGE
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path and path != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            _err(f"{option} {path}: the folder {os.path.dirname(os.path.abspath(path))} does not exist")
            return EXIT_USAGE
        if path and path != "-" and os.path.isdir(path):  # found before the run, not after it
            _err(f"{option} {path}: is a folder; give a file name")
            return EXIT_USAGE
    if args.plot == "-":
        _err("--plot needs a file name")
        return EXIT_USAGE
    if args.plot and os.path.splitext(args.plot)[1]:  # no extension: benchmark.plot adds .png
        from matplotlib.figure import Figure
        kinds = Figure().canvas.get_supported_filetypes()
        if os.path.splitext(args.plot)[1][1:].lower() not in kinds:
            _err(f"--plot {args.plot}: matplotlib cannot write {os.path.splitext(args.plot)[1]} files; use one of "
                 f"{', '.join('.' + k for k in sorted(kinds))}")
            return EXIT_USAGE
    if args.workers is not None and not args.baseline:
        _err("--workers sets torchvision's DataLoader workers: it needs --baseline torchvision (FastLoader's decode "
             "threads: --threads)")
        return EXIT_USAGE

    dataset = benchmark.open_dataset(args.data)  # DatasetError -> exit 2
    batches = len(dataset) // args.batch_size
    if 0 < batches < 50:
        print(f"note: {len(dataset)} images make only {batches} batch{'es' if batches > 1 else ''} of "
              f"{args.batch_size} per epoch; the start "
              f"and end of every epoch weigh on these numbers (more images measure steadier rates)", file=sys.stderr)
    result = benchmark.run(dataset, baseline=args.baseline, device=device, batch_size=args.batch_size,
                           threads=args.threads, workers=args.workers, epochs=args.epochs, size=args.size,
                           model=args.model, progress=not args.quiet, decoder=args.decoder,
                           transform=args.transform, cuda_graph=args.cuda_graph)
    title = "fastload bench: " + benchmark.describe(result)
    table = benchmark.format_table(result["rows"], title)
    if args.json == "-":
        print(table, file=sys.stderr)
        print(json.dumps(result, indent=2))
    else:
        print(table)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
            print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        written = benchmark.plot(result["rows"], args.plot, subtitle=benchmark.describe(result))
        print(f"wrote {written}", file=sys.stderr)
    return EXIT_OK


#: Subcommands in the order `fastload --help` lists them; each adds its parser and sets ``func``.
SUBCOMMANDS = [add_pack, add_inspect, add_verify, add_bench]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="fastload", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES,
        description="fastload: JPEG batches for PyTorch training, decoded only where the crop is.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv=None):
    """Runs the command line; returns the exit code (usage errors and --help included, no SystemExit)."""
    # File and class names need not be valid text (Latin-1 bytes on a UTF-8 system): printed escaped rather than
    # ending the command with a UnicodeEncodeError where stdout is strict (an en_US.UTF-8 desktop's is).
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 for --help
        return e.code if isinstance(e.code, int) else EXIT_OK
    import warnings

    from .datasets.base import DataError, DatasetError
    from .errors import DecodeError

    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return args.func(args)
    except DatasetError as e:
        _err(e)
        return EXIT_USAGE
    except (DataError, DecodeError) as e:  # DecodeError: a damaged sample met while loading (bench)
        _err(e)
        return EXIT_DATA
    except KeyboardInterrupt:
        started = args.command == "pack" and os.path.isdir(os.path.abspath(args.dst).rstrip(os.sep) + ".partial")
        _err("interrupted" + ("; continue the pack with --resume" if started else ""))
        return 130
    except BrokenPipeError:  # e.g. `fastload inspect DST | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        _err(f"{where}{e.strerror or e}")
        return EXIT_DATA
    except Exception as e:
        import lmdb

        if isinstance(e, lmdb.Error):
            _err(f"LMDB: {e}")
            return EXIT_DATA
        raise
