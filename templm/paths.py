"""templm's one path layer: a path is a local file name or a URL (gs://bucket/x, or any other scheme TensorFlow's file
system serves: s3:// with tensorflow-io, ram:// in memory, hdfs://). Local paths go through `os`; URLs through
`tf.io.gfile`, imported only when a URL is first used (a local run never pays TensorFlow's import here). Nothing
here treats a URL as a local name: `os.path.abspath("gs://b/x")` is "./gs:/b/x", the defect this layer exists to
prevent.

Object stores are not file systems: a bucket has no folders (a "folder" is a prefix; `makedirs` is a no-op there
beyond a placeholder), no rename (`rename` is copy then delete, not atomic) and no flock. An object appears only
when its upload is complete and replacing one is atomic, which is what `templm.io.atomic_write` relies on there.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import glob as _glob
import os
import posixpath
import re
import shutil
import tempfile
from typing import IO, Iterator, List, Optional

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_url(path) -> bool:
    """True for a path with a scheme (gs://, s3://, ram://); file:// counts as a URL too and is served as one."""
    return bool(_URL.match(os.fspath(path))) if isinstance(path, (str, os.PathLike)) else False


def scheme(path) -> str:
    """"gs" of gs://b/x, "" of a local path."""
    path = os.fspath(path)
    return path.split("://", 1)[0].lower() if is_url(path) else ""


def bucket(path) -> str:
    """"b" of gs://b/x/y; "" of a local path."""
    return os.fspath(path).split("://", 1)[1].split("/", 1)[0] if is_url(path) else ""


def absolute(path) -> str:
    """A local path made absolute (`~` expanded); a URL as it is, less trailing slashes after its bucket."""
    path = os.fspath(path)
    if is_url(path):
        head, rest = path.split("://", 1)
        rest = rest.rstrip("/")
        return f"{head}://{rest}" if rest else path
    return os.path.abspath(os.path.expanduser(path))


def join(base, *parts) -> str:
    base = os.fspath(base)
    return posixpath.join(base, *map(os.fspath, parts)) if is_url(base) else os.path.join(base, *parts)


def relpath(path, start) -> str:
    """`path` relative to the folder `start`: both local, or both URLs of one scheme and bucket (ValueError
    otherwise)."""
    path, start = absolute(path), absolute(start)
    if not is_url(path) and not is_url(start):
        return os.path.relpath(path, start)
    if (scheme(path), bucket(path)) != (scheme(start), bucket(start)) or not (is_url(path) and is_url(start)):
        raise ValueError(f"{path} is not in the store of {start}")
    return posixpath.relpath("/" + key(path), "/" + key(start))


def resolve(base, relative) -> str:
    """`relative` (a path relative to the folder `base`, as `relpath` gives it) as a path, normalised; a URL or an
    absolute local path as it is. Under a URL `..` stops at the bucket."""
    relative = os.fspath(relative)
    if is_url(relative) or os.path.isabs(relative):
        return relative
    base = absolute(base)
    if not is_url(base):
        return os.path.normpath(os.path.join(base, relative))
    name = posixpath.normpath(posixpath.join("/" + key(base), relative)).lstrip("/")
    return f"{base.split('://', 1)[0]}://{bucket(base)}" + (f"/{name}" if name else "")


def key(url: str) -> str:
    """"x/y" of gs://b/x/y (the object name or prefix in its bucket)."""
    rest = absolute(url).split("://", 1)[1]
    return rest.split("/", 1)[1] if "/" in rest else ""


def dirname(path) -> str:
    path = os.fspath(path)
    if is_url(path):
        head, rest = absolute(path).split("://", 1)
        return f"{head}://{posixpath.dirname(rest)}" if "/" in rest else f"{head}://{rest}"
    return os.path.dirname(path)


def basename(path) -> str:
    path = os.fspath(path)
    return posixpath.basename(absolute(path)) if is_url(path) else os.path.basename(path)


def gfile():
    """tf.io.gfile, imported on first use."""
    import tensorflow as tf

    return tf.io.gfile


def exists(path) -> bool:
    path = os.fspath(path)
    return gfile().exists(path) if is_url(path) else os.path.exists(path)


def lexists(path) -> bool:
    """exists, without following a local symlink."""
    path = os.fspath(path)
    return gfile().exists(path) if is_url(path) else os.path.lexists(path)


def isdir(path) -> bool:
    path = os.fspath(path)
    return gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def isfile(path) -> bool:
    path = os.fspath(path)
    if is_url(path):
        return gfile().exists(path) and not gfile().isdir(path)
    return os.path.isfile(path)


def makedirs(path) -> None:
    path = os.fspath(path)
    if is_url(path):
        gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def listdir(path) -> List[str]:
    """The names in a folder (a URL's sub-prefixes without their trailing slash)."""
    path = os.fspath(path)
    if is_url(path):
        return sorted(name.rstrip("/") for name in gfile().listdir(path))
    return sorted(os.listdir(path))


def glob(pattern) -> List[str]:
    pattern = os.fspath(pattern)
    return sorted(gfile().glob(pattern)) if is_url(pattern) else sorted(_glob.glob(pattern))


def has_magic(pattern) -> bool:
    return _glob.has_magic(os.fspath(pattern))


def size(path) -> int:
    path = os.fspath(path)
    return gfile().stat(path).length if is_url(path) else os.path.getsize(path)


def open(path, mode: str = "r", encoding: str = "utf-8") -> IO:  # noqa: A001 (the module's `open`, as gfile's)
    """A file object of `path`; text modes decode as `encoding`. A missing file to read is FileNotFoundError at a URL
    too (TensorFlow would raise its own NotFoundError only at the first read)."""
    path = os.fspath(path)
    if not is_url(path):
        return builtins.open(path, mode, encoding=None if "b" in mode else encoding)
    if "r" in mode and not gfile().exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    import io

    raw = gfile().GFile(path, mode.replace("t", "").replace("b", "") + "b")
    return raw if "b" in mode else io.TextIOWrapper(_Buffered(raw), encoding=encoding, newline=None)


def text_stream(binary: IO, encoding: str = "utf-8", newline: Optional[str] = None) -> IO:
    """Text read from a binary file object: a local file's, a gzip or bz2 stream's, or a bucket's GFile."""
    import io

    return io.TextIOWrapper(binary if isinstance(binary, io.IOBase) else _Buffered(binary), encoding=encoding,
                            newline=newline)


def binary_stream(raw: IO) -> IO:
    """A bucket's GFile opened to read bytes as a buffered binary stream, whose `readline(size)` stops at `size` (a
    GFile's own readline takes no size and reads a whole line, however long)."""
    import io

    return io.BufferedReader(_Buffered(raw))


class _Buffered:
    """A GFile in binary mode as the raw stream io.TextIOWrapper wants."""

    def __init__(self, raw):
        self.raw = raw
        self.closed = False

    def readable(self) -> bool:
        return "r" in self.raw.mode

    def writable(self) -> bool:
        return "w" in self.raw.mode or "a" in self.raw.mode

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        return self.raw.read(n)

    def read1(self, n: int = -1) -> bytes:
        return self.raw.read(n if n and n > 0 else 1 << 16)

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def write(self, data) -> int:
        self.raw.write(bytes(data))
        return len(data)

    def flush(self) -> None:
        if self.writable():
            self.raw.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.raw.close()


def remove(path) -> None:
    path = os.fspath(path)
    if is_url(path):
        gfile().remove(path)
    else:
        os.remove(path)


def rmtree(path) -> None:
    """Removes a folder and everything under it; nothing where there is nothing."""
    path = os.fspath(path)
    if is_url(path):
        if gfile().exists(path):
            gfile().rmtree(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def copy(source, target, overwrite: bool = False) -> None:
    """Copies a file between any two places (a local file into a bucket, an object to a local file)."""
    source, target = os.fspath(source), os.fspath(target)
    if is_url(source) or is_url(target):
        gfile().copy(source, target, overwrite=overwrite)
    elif not overwrite and os.path.exists(target):
        raise FileExistsError(target)
    else:
        shutil.copyfile(source, target)


@contextlib.contextmanager
def local_file(path) -> Iterator[str]:
    """A local copy of `path` for the block (a library that opens files by name itself, as SentencePiece's loader);
    a local path is given as it is."""
    path = os.fspath(path)
    if not is_url(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="templm-") as tmp:
        local = os.path.join(tmp, basename(path))
        gfile().copy(path, local, overwrite=True)
        yield local
