"""Another local user's files where the loader keeps a large index's host copy (issue 43).

The temporary directory is shared by every local user (here a sticky 1777 folder named by
``TMPDIR``, as ``/tmp`` is), and a copy's name follows from the public index sha256. An
attacker plants at every name the loader may use: the flat ``<tmp>/shardflow-index-<key>.bin``
of the code before, and this user's folder ``<tmp>/shardflow-index-<euid>/``. Planted: a
self-consistent copy of another, smaller index; a ``.lock`` held by a process of theirs; a
copy truncated while the loader maps it; links in place of the folder or a file; a copy others
may write. In every case the loader reads exactly the batches of a clean run (another empty
temporary directory), ends with rc 0, and maps only files of its own user that no one else may
write. The other user is ``nobody``, played by a forked child that drops to its uid (so the
tests that need one run as root); the rest plant as this user.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from loaders import shared_index
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource, samples_from_starts
from storage import ReplicaSet

ROOT = Path(__file__).resolve().parents[2]
SEQ = 127
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")

#: The loader, in a process of its own (a SIGBUS or a hang is a failed test, not a dead run):
#: the first 25 batches of both ranks of a 2-rank layout (of 80 an epoch), hashed; the files it
#: maps. With a third argument it waits for a line on stdin after opening the dataset (the test
#: acts then).
LOADER = r"""
import hashlib, itertools, json, os, sys
import loaders.shared_index as si
si.MIN_INDEX_BYTES = 0
from loaders.plan import Layout, Progress
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource, rank_stream
source = DatasetSource(sys.argv[1], LoaderSettings(int(sys.argv[2])))
if len(sys.argv) > 3:
    print("ready", flush=True)
    sys.stdin.readline()
digest, n = hashlib.sha256(), 0
for rank in (0, 1):
    stream = rank_stream(source, Layout(8, 1, 2, rank, 4), Progress()).batches()
    for batch in itertools.islice(stream, 25):  # fewer if the epoch is shorter
        digest.update(batch.tobytes())
        n += 1
maps = {(line.split()[5], int(line.split()[4])) for line in open("/proc/self/maps")
        if "shardflow-index-" in line}
print(json.dumps({"batches": digest.hexdigest(), "n": n, "samples": source.n_samples,
                  "refused": getattr(si, "refused", None), "mapped": sorted(maps)}))
"""


def _dataset(path: Path, row_groups: int, seed: int) -> str:
    from benchmarks.bench_utils import write_token_dataset

    tokens = np.random.default_rng(seed).integers(0, 50_000, row_groups * 2048, dtype=np.uint16)
    write_token_dataset(ReplicaSet.from_urls([str(path)]), tokens, 4, row_group_tokens=2048,
                        doc_tokens=256)
    return str(path)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The dataset the loader reads, and a smaller one the attacker's copies describe."""
    root = tmp_path_factory.mktemp("datasets")
    return _dataset(root / "ds", 40, 3), _dataset(root / "small", 6, 5)


def _copies(dataset: str, keyed_like: str) -> dict[str, bytes]:
    """``dataset``'s arrays as self-consistent copies (the loader's own encoding, checksum
    inside), under the file names of ``keyed_like``'s copies."""
    sha = ReplicaSet.from_urls([keyed_like]).read_manifest().index.sha256[:16]
    index = DatasetSource(dataset, LoaderSettings(SEQ)).index
    out = {}
    for key, arrays in ((f"{sha}-starts", {"starts": np.asarray(index.starts),
                                           "first_group": np.asarray(index.first_group)}),
                        (f"{sha}-samples2-{SEQ}", samples_from_starts(index.starts, SEQ))):
        head, parts = shared_index._encode(arrays)
        out[f"shardflow-index-{key}.bin"] = head + b"".join(bytes(p) for p in parts)
    return out


@pytest.fixture(scope="module")
def foreign(datasets: tuple[str, str]) -> dict[str, bytes]:
    """Copies of the smaller index's arrays named as the loaded dataset's."""
    return _copies(datasets[1], datasets[0])


@pytest.fixture
def world_tmp() -> Iterator[Path]:
    """A fresh temporary directory like /tmp: sticky, writable by everyone."""
    path = Path(tempfile.mkdtemp(prefix="shardflow-tmp-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    env.pop(shared_index.ENV_DIR, None)
    return env


def load(dataset: str, tmp: Path, timeout: float = 120) -> dict:
    """The loader's batches with ``TMPDIR=tmp`` (a hang fails after ``timeout``)."""
    try:
        out = subprocess.run([sys.executable, "-c", LOADER, dataset, str(SEQ)], env=_env(tmp),
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the loader did not finish in {timeout} s (blocked on a lock?)")
    assert out.returncode == 0, f"rc {out.returncode}: {out.stderr[-3000:]}"
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def clean(datasets: tuple[str, str]) -> dict:
    """The batches with nothing planted."""
    path = Path(tempfile.mkdtemp(prefix="shardflow-clean-", dir="/tmp"))
    try:
        return load(datasets[0], path)
    finally:
        shutil.rmtree(path)


def assert_same_and_own(got: dict, clean: dict) -> None:
    """The clean run's batches, and every file mapped is this user's, writable by no other."""
    assert (got["batches"], got["n"], got["samples"]) == (
        clean["batches"], clean["n"], clean["samples"])
    for path, inode in got["mapped"]:
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and st.st_ino == inode, path
        assert st.st_uid == os.geteuid() and not st.st_mode & 0o022, (path, st)


def as_user(uid: int, action: Callable[[], object]) -> str:
    """``action()`` in a forked child running as ``uid`` (and its gid); its result or error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(write, repr(action()).encode()[:4000])
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write, f"{type(exc).__name__}: {exc}".encode()[:4000])
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        out = fh.read().decode()
    os.waitpid(pid, 0)
    return out


def own_folder(tmp: Path) -> Path:
    return tmp / f"shardflow-index-{os.geteuid()}"


def plant(tmp: Path, files: dict[str, bytes], folder_mode: int = 0o755) -> Callable[[], str]:
    """An action planting ``files`` at the flat names and in a folder squatting this user's
    folder name (for :func:`as_user`)."""
    folder = own_folder(tmp)  # this user's, named before the action runs as another

    def action() -> str:
        folder.mkdir(mode=folder_mode)
        folder.chmod(folder_mode)
        for where in (tmp, folder):
            for name, data in files.items():
                (where / name).write_bytes(data)
        return "planted"
    return action


@as_root
def test_another_users_copies_of_a_smaller_index_are_not_read(
        datasets: tuple[str, str], foreign: dict[str, bytes], clean: dict,
        world_tmp: Path) -> None:
    """The reported attack: a self-consistent copy of another index, written first by another
    user, at the flat names and in a squatted folder of this user's name (refused: the
    arrays stay in process memory)."""
    assert as_user(NOBODY, plant(world_tmp, foreign)) == "'planted'"
    got = load(datasets[0], world_tmp)
    assert_same_and_own(got, clean)
    assert got["refused"] >= 1
    assert (own_folder(world_tmp) / next(iter(foreign))).read_bytes() == foreign[
        next(iter(foreign))]  # theirs, left alone


@as_root
def test_a_lock_held_by_another_users_process_does_not_block(
        datasets: tuple[str, str], clean: dict, world_tmp: Path) -> None:
    names = [f"{name}.lock" for name in _copies(datasets[0], datasets[0])]
    folder = own_folder(world_tmp)
    ready, release = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the other user's process, holding the locks until told
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            folder.mkdir(mode=0o777)
            folder.chmod(0o777)
            held = []
            for where in (world_tmp, folder):
                for name in names:
                    fd = os.open(where / name, os.O_RDWR | os.O_CREAT, 0o666)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    held.append(fd)
            os.write(ready[1], b"held")
            os.read(release[0], 1)
        finally:
            os._exit(0)
    try:
        assert os.read(ready[0], 16) == b"held"
        got = load(datasets[0], world_tmp, timeout=90)
        assert_same_and_own(got, clean)
    finally:
        os.write(release[1], b"x")
        os.waitpid(pid, 0)


@as_root
def test_a_copy_truncated_while_mapped_does_not_kill_the_loader(
        datasets: tuple[str, str], clean: dict, world_tmp: Path) -> None:
    """Another user's *correct* copy (the loaded index's own arrays), truncated once the
    loader has opened the dataset: nothing of theirs is mapped, so no SIGBUS; and they cannot
    reach this user's copies to truncate them."""
    correct = _copies(datasets[0], datasets[0])
    assert as_user(NOBODY, plant(world_tmp, correct, 0o777)) == "'planted'"
    proc = subprocess.Popen([sys.executable, "-c", LOADER, datasets[0], str(SEQ), "wait"],
                            env=_env(world_tmp), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"

        def truncate() -> list[str]:
            out = []
            for path in sorted(world_tmp.rglob("shardflow-index-*.bin")):
                try:
                    os.truncate(path, 0)
                    out.append(f"truncated {path}")
                except OSError as exc:
                    out.append(f"{type(exc).__name__} {path}")
            return out

        truncated = as_user(NOBODY, truncate)
        assert "truncated" in truncated
        stdout, stderr = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, f"rc {proc.returncode} (-7: SIGBUS): {stderr[-3000:]}"
    assert_same_and_own(json.loads(stdout.splitlines()[-1]), clean)


def _run_then_replace(datasets: tuple[str, str], tmp: Path,
                      replace: Callable[[Path, bytes], None], foreign: dict[str, bytes]
                      ) -> list[Path]:
    """A clean run in ``tmp`` (its copies written), then ``replace(copy, planted bytes)`` for
    each copy, wherever the loader put it."""
    load(datasets[0], tmp)
    copies = sorted(p for p in tmp.rglob("shardflow-index-*.bin") if p.name in foreign)
    assert len(copies) == 2, copies
    for path in copies:
        replace(path, foreign[path.name])
    return copies


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_copy_others_may_write_is_rebuilt(datasets: tuple[str, str], foreign: dict[str, bytes],
                                            clean: dict, world_tmp: Path, mode: int) -> None:
    """A copy of this user's that a group or other users may write (here: they did, with a
    self-consistent copy of another index) is not read, but rebuilt, private."""
    def replace(path: Path, data: bytes) -> None:
        path.write_bytes(data)
        path.chmod(mode)

    copies = _run_then_replace(datasets, world_tmp, replace, foreign)
    assert_same_and_own(load(datasets[0], world_tmp), clean)
    for path in copies:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_bytes() != foreign[path.name]


@as_root
def test_a_copy_another_user_owns_is_rebuilt(datasets: tuple[str, str],
                                             foreign: dict[str, bytes], clean: dict,
                                             world_tmp: Path) -> None:
    def replace(path: Path, data: bytes) -> None:
        path.write_bytes(data)
        os.chown(path, NOBODY, NOBODY)

    copies = _run_then_replace(datasets, world_tmp, replace, foreign)
    assert_same_and_own(load(datasets[0], world_tmp), clean)
    for path in copies:
        assert path.stat().st_uid == os.geteuid()


@as_root
def test_an_own_folder_others_could_write_is_made_private(
        datasets: tuple[str, str], foreign: dict[str, bytes], clean: dict,
        world_tmp: Path) -> None:
    """This user's folder left writable by all: another user puts a copy of another index and
    a FIFO (which would block a read) in it under the copies' names. The folder is made 0700
    again, their files are replaced, the batches are the clean run's."""
    load(datasets[0], world_tmp)
    folder = own_folder(world_tmp)
    folder.chmod(0o777)
    samples, starts = sorted(foreign)  # "...-samples2-127.bin" sorts first

    def action() -> str:
        (folder / starts).unlink()
        (folder / starts).write_bytes(foreign[starts])
        (folder / samples).unlink()
        os.mkfifo(folder / samples, 0o600)
        return "planted"

    assert as_user(NOBODY, action) == "'planted'"
    assert_same_and_own(load(datasets[0], world_tmp, timeout=90), clean)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in (starts, samples):
        st = (folder / name).lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def test_a_link_in_place_of_a_copy_is_replaced_not_followed(
        datasets: tuple[str, str], foreign: dict[str, bytes], clean: dict, world_tmp: Path,
        tmp_path: Path) -> None:
    """A symbolic link where a copy was, to a self-consistent copy of another index: the link
    is replaced by a copy of this user's own, its target is left as it was."""
    targets = []

    def replace(path: Path, data: bytes) -> None:
        target = tmp_path / f"evil-{path.name}"
        target.write_bytes(data)
        targets.append(target)
        path.unlink()
        path.symlink_to(target)

    copies = _run_then_replace(datasets, world_tmp, replace, foreign)
    assert_same_and_own(load(datasets[0], world_tmp), clean)
    for path in copies:
        assert not path.is_symlink() and path.is_file()
    for target in targets:
        assert target.read_bytes() == foreign[target.name.removeprefix("evil-")]


def test_a_link_in_place_of_the_folder_is_not_followed(
        datasets: tuple[str, str], foreign: dict[str, bytes], clean: dict, world_tmp: Path,
        tmp_path: Path) -> None:
    """This user's folder name (and the flat copies' names) as symbolic links to a folder
    of self-consistent copies of another index: refused, the arrays stay in process memory,
    nothing is written through the link."""
    evil = tmp_path / "evil"
    evil.mkdir(mode=0o700)
    for name, data in foreign.items():
        (evil / name).write_bytes(data)
        (world_tmp / name).symlink_to(evil / name)
    own_folder(world_tmp).symlink_to(evil, target_is_directory=True)
    got = load(datasets[0], world_tmp)
    assert_same_and_own(got, clean)
    assert got["refused"] >= 1
    assert sorted(p.name for p in evil.iterdir()) == sorted(foreign)
    assert all((evil / name).read_bytes() == data for name, data in foreign.items())


def test_the_folder_and_copies_are_private(datasets: tuple[str, str], clean: dict,
                                           world_tmp: Path) -> None:
    """What a clean run leaves: a 0700 folder of this user's, 0600 copies and locks in it,
    nothing at the flat names."""
    assert_same_and_own(load(datasets[0], world_tmp), clean)
    folder = own_folder(world_tmp)
    st = folder.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o700
    files = sorted(folder.iterdir())
    assert len(files) == 4, files  # two copies, their locks
    for path in files:
        assert path.stat().st_uid == os.geteuid() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in world_tmp.iterdir()) == [folder.name]


def test_a_copy_of_another_index_under_the_name_is_replaced(
        datasets: tuple[str, str], foreign: dict[str, bytes], clean: dict,
        world_tmp: Path) -> None:
    """Even a copy of this user's own, private, of another index (the name is only a prefix
    of the index's sha256) fails the manifest's totals and is replaced."""
    copies = _run_then_replace(datasets, world_tmp, lambda p, data: p.write_bytes(data), foreign)
    assert_same_and_own(load(datasets[0], world_tmp), clean)
    for path in copies:
        assert path.read_bytes() != foreign[path.name]
