"""Framework-free MNIST loader shared by the trainers (numpy only).

The bundled ``data/mnist.npz`` is zip-compressed, so numpy cannot memory-map it: every job that
called ``np.load(npz)`` would hold its own decompressed copy (and the float32 version the study
probe made cost ~376 MB per job). Instead each array is extracted once into a cache folder as a
plain ``.npy`` and memory-mapped read-only, so any number of packed jobs share one page-cache copy
(~55 MB). Pixels stay uint8 and become float32 one batch at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

BUNDLED = Path(__file__).resolve().parent / "data" / "mnist.npz"
SHA256 = "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64"
ARRAYS = ("x_train", "y_train", "x_test", "y_test")
CACHE_ENV = "MEMGOV_DATA_CACHE"


class DataError(RuntimeError):
    """The data file is missing, corrupt, or not what was expected."""


def sha256_of(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()  # hashlib.file_digest would need Python 3.11
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cache_root() -> Path:
    """``$MEMGOV_DATA_CACHE``, else ``$XDG_CACHE_HOME/memgov``, else ``~/.cache/memgov``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "memgov"


def load(
    path: str | os.PathLike[str] | None = None,
    expected_sha256: str | None = SHA256,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(x_train, y_train, x_test, y_test)`` as read-only uint8 memory maps.

    ``path`` defaults to the bundled file. The file's sha256 must equal ``expected_sha256``
    (the bundled file's hash unless told otherwise); pass ``None`` to accept any file.
    """
    src = Path(path) if path is not None else BUNDLED
    if not src.is_file():
        raise DataError(f"MNIST data file not found: {src}")
    actual = sha256_of(src)
    if expected_sha256 is not None and actual != expected_sha256.strip().lower():
        raise DataError(
            f"sha256 mismatch for {src}: expected {expected_sha256}, got {actual} "
            "(corrupt or different file; pass --data-sha256 <hash> or --data-sha256 skip "
            "to accept it)"
        )
    # Keyed by the content hash, so a different --data file never reuses another's arrays.
    folder = Path(cache_dir) if cache_dir is not None else cache_root()
    folder = folder / f"mnist-{actual[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink():
        raise DataError(f"refusing to use cache folder that is a symlink: {folder}")

    arrays = []
    try:
        with zipfile.ZipFile(src) as zf:
            for name in ARRAYS:
                info = zf.getinfo(f"{name}.npy")
                target = folder / f"{name}.npy"
                if not _is_complete(target, info.file_size):
                    _extract(zf, info, target)
                arrays.append(np.load(target, mmap_mode="r", allow_pickle=False))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise DataError(f"cannot read MNIST arrays from {src} (cache {folder}): {exc}") from exc

    x_train, y_train, x_test, y_test = arrays
    for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "test")):
        if x.dtype != np.uint8 or y.dtype != np.uint8 or x.ndim != 3 or y.ndim != 1:
            raise DataError(f"{src}: {split} arrays are not uint8 images (N,H,W) + labels (N,)")
        if len(x) != len(y):
            raise DataError(f"{src}: {split} has {len(x)} images but {len(y)} labels")
    return x_train, y_train, x_test, y_test


def _is_complete(target: Path, size: int) -> bool:
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return False
    # The cache may live in a folder others can write (MEMGOV_DATA_CACHE): never follow a
    # planted symlink to someone else's data.
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"refusing cached file that is not a regular file: {target}")
    # Writers only ever os.replace a complete file in, so a wrong size means outside damage;
    # re-extracting over it is safe.
    return st.st_size == size


def _extract(zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    """Copy one member to ``target`` atomically.

    Trainers started together race to fill an empty cache: each writes its own temp file in the
    same folder and renames it over the target. Rename is atomic, all writers produce identical
    bytes, so readers see either no file or a complete one, and whoever renames last wins.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, zf.open(info) as member:
            # Streams and checks the zip CRC, so a damaged member never reaches the cache.
            shutil.copyfileobj(member, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        # mkstemp makes 0600; a cache shared between users must stay readable.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # Make the rename itself durable, or a crash could leave the name pointing nowhere.
    dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def to_float(x: np.ndarray, channels_last: bool = True) -> np.ndarray:
    """uint8 images (N,H,W) -> float32 in [0, 1] with a channel axis, NHWC or NCHW."""
    xf = np.divide(x, 255.0, dtype=np.float32)
    return xf[..., None] if channels_last else xf[:, None]


def batches(
    x: np.ndarray,
    y: np.ndarray,
    batch: int,
    rng: np.random.Generator | None = None,
    channels_last: bool = True,
    raw: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(images float32, labels int64)`` batches; shuffled when ``rng`` is given.

    The last batch is kept even if short, so every sample is seen once per epoch. ``raw``: the
    images stay uint8 (0-255, with the channel axis), for a trainer that scales them on the
    device: a quarter of the bytes to copy and no float work on the host's scarce cores.
    """
    n = len(x)
    order = rng.permutation(n) if rng is not None else None
    for start in range(0, n, batch):
        if order is None:
            xb, yb = x[start : start + batch], y[start : start + batch]
        else:
            idx = order[start : start + batch]
            xb, yb = x[idx], y[idx]
        if raw:
            yield (xb[..., None] if channels_last else xb[:, None]), yb.astype(np.int64)
        else:
            yield to_float(xb, channels_last), yb.astype(np.int64)
