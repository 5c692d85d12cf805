"""The command line as a user meets it (`python -m fastload ...` in a subprocess, output captured): warnings as
readable lines, `pack -q`, the rate after --resume, progress in a non-terminal; and CI's per-test time limit."""
import importlib
import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fastload.datasets import progress as progress_mod
from pack_corpus import add_broken, jpeg_files, photo_tree

ROOT = Path(__file__).resolve().parents[1]
pack_mod = importlib.import_module("fastload.datasets.pack")  # the module; fastload.datasets.pack is the function


def fastload(*args, timeout=120, **env):
    return subprocess.run([sys.executable, "-m", "fastload", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@pytest.fixture(scope="module")
def tree(imagenet_dir, tmp_path_factory):
    return photo_tree(imagenet_dir, tmp_path_factory.mktemp("cli") / "photos", png=False)


def test_warnings_are_readable_lines(tree, tmp_path):
    broken = photo_tree(tree, tmp_path / "b", png=False)
    (broken / "class_01" / "empty.jpg").write_bytes(b"")
    r = fastload("inspect", broken)
    assert r.returncode == 0, r.stderr
    assert f"fastload: warning: {broken}: 1 of 49 files cannot be used: {broken}/class_01/empty.jpg: empty file" \
        in r.stderr
    assert "UserWarning" not in r.stderr and ".py:" not in r.stderr  # no `cli.py:60: UserWarning:` and source line


def test_pack_quiet_leaves_stderr_to_problems(tree, tmp_path):
    """-q: no progress and no progress messages on stderr; the summary (and skipped files) on stdout as always."""
    loud = fastload("pack", tree, tmp_path / "loud.lmdb")
    assert loud.returncode == 0 and loud.stderr.startswith("packing 48 files")
    r = fastload("pack", tree, tmp_path / "a.lmdb", "-q")
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("packed 48 images from 48 files")
    broken = photo_tree(tree, tmp_path / "b", png=False)
    add_broken(broken, jpeg_files(broken)[0])
    r = fastload("pack", broken, tmp_path / "b.lmdb", "-q")
    assert r.returncode == 0 and r.stderr == ""
    assert "skipped 8 files" in r.stdout and "empty.jpg: empty file" in r.stdout


def test_resume_reports_the_rate_of_this_run(tree, tmp_path, monkeypatch):
    """A pack interrupted after its first commit of 8 files, resumed in a subprocess: the summary says this run
    packed the other 40 and computes its rate from them (it used to divide all 48 files by this run's time)."""
    dst = tmp_path / "r.lmdb"
    real, calls = pack_mod._write, []

    def interrupt_after_first_commit(env, puts=(), deletes=()):
        calls.append(1)
        if len(calls) == 3:  # 1: the plan, 2: the first 8 files, 3: the next batch
            raise KeyboardInterrupt
        return real(env, puts, deletes)

    monkeypatch.setattr(pack_mod, "_write", interrupt_after_first_commit)
    with pytest.raises(KeyboardInterrupt):
        pack_mod.pack(tree, dst, commit_every=8, workers=1, progress=False, log=lambda m: None)
    # Slowed down (0.2 s after each of its 5 commits) so that its time, printed to 0.1 s, gives a precise rate.
    r = fastload("pack", tree, dst, "--resume", "--commit-every", "8", FASTLOAD_PACK_SLOWDOWN="0.2")
    assert r.returncode == 0, r.stderr
    assert "resuming" in r.stderr and "8 of 48 files done" in r.stderr
    line = r.stdout.splitlines()[0]
    assert line.startswith(f"packed 48 images from 48 files into {dst} in ")
    seconds = float(line.split(" in ")[1].split(" s ")[0])
    rate = float(line.split("(")[1].split(" files/s")[0].replace(",", ""))
    assert "this run packed 40 of them" in line
    assert seconds >= 1.0 and rate == pytest.approx(40 / seconds, rel=0.06)  # rounding of the 0.1 s only
    r = fastload("pack", tree, dst, "--resume")  # already complete: nothing was packed, no rate is made up
    assert r.returncode == 0 and "nothing left to pack" in r.stdout


def test_progress_in_a_non_terminal_is_lines_not_carriage_returns(tree, tmp_path, monkeypatch):
    r = fastload("pack", tree, tmp_path / "p.lmdb", FASTLOAD_PACK_SLOWDOWN="0")
    assert r.returncode == 0 and "\r" not in r.stderr and "\r" not in r.stdout
    # The line printer itself: a line per interval, each with the count and rate, and a final one.
    out = io.StringIO()
    monkeypatch.setattr(progress_mod, "LINE_INTERVAL", 0.05)
    bar = progress_mod.progress(30, desc="pack", unit="file", stream=out)
    for _ in range(3):
        time.sleep(0.06)
        bar.update(10)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 4
    assert lines[0].startswith("pack: 10/30 files (33%), ") and lines[-1].startswith("pack: 30/30 files (100%), ")
    quiet = io.StringIO()
    bar = progress_mod.progress(30, desc="pack", unit="file", stream=quiet, enabled=False)
    time.sleep(0.06)
    bar.update(30)
    bar.close()
    assert quiet.getvalue() == ""


def test_a_hanging_test_fails_within_its_limit_with_every_threads_stack(tmp_path):
    """The suite's pytest-timeout settings (pyproject.toml): a test that hangs is stopped, every thread's stack
    printed (a background thread's included), and the run ends with a failure instead of hanging CI."""
    test = tmp_path / "test_hang.py"
    test.write_text(textwrap.dedent("""
        import threading, time

        def stuck_in_a_worker():
            time.sleep(600)

        def test_hangs():
            threading.Thread(target=stuck_in_a_worker, name="worker-under-test", daemon=True).start()
            threading.Event().wait()
    """))
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                        str(tmp_path), "-o", "timeout=3", "-p", "no:cacheprovider", str(test)],
                       capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 60
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Timeout" in out
    assert "stuck_in_a_worker" in out and "test_hangs" in out  # both threads' stacks
