"""The vector snapshot file: the cached keys' arrays, written once and mapped by every process.

Layout: a fixed prefix (magic, format version, header length, data length, the data's CRC-32,
the header's CRC-32) in the first page, the data: per key its ids, times, rows, scales (int8)
and sign codes (when packed), each array at the key's capacity; then the header (JSON: the
database instance, vector epoch, model, dimension and form it is of, the change-log mark it
reflects, where each key's arrays lie), last so that keys are written as they are read. Rows
past a key's count are free (id -1, zeros): a process appends a new vector there in its own
copy of that page (the map is private, copy-on-write), never in the file.

A folder holds a database's snapshots: `vectors-<generation>.snap` (0600, in a 0700 folder),
written to a temporary name and renamed, and `lock`: taken exclusively by a writer (a new
generation, a scrub), shared by a reader while it opens and checks a file. A process mapping a
generation holds a shared lock on that file through its map's own descriptor, until the last
array viewing the map is gone: `prune` deletes an older generation only once nobody maps it.
"""
from __future__ import annotations

import fcntl
import json
import logging
import mmap
import os
import struct
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from bot.memory.vectors import codes as vector_codes

log = logging.getLogger("bot.memory.vectors")

MAGIC = b"MUNVSNAP"
VERSION = 1
PREFIX = struct.Struct("<8sIIQII")  # magic, version, header length, data length, data CRC, header CRC
ALIGN = 64                          # every array starts on a cache line
DATA_ALIGN = 4096                   # the data starts on a page
SUFFIX = ".snap"
CRC_BLOCK = 64 << 20                # the checksum reads this much of the map at a time


# One key as written: (key, ids, created_at, rows, scales or None, codes or None, capacity).
# Arrays hold live rows only; `capacity` >= their count leaves free rows for appends.
Part = tuple[str, np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None", int]


class SnapshotProblem(Exception):
    """A snapshot file that must not be served: why, in a few words. `keep`: it is not wrong, only
    newer than the reader (written after a reindex this process has not seen yet)."""

    def __init__(self, why: str, keep: bool = False) -> None:
        super().__init__(why)
        self.keep = keep


@contextmanager
def folder_lock(folder: Path, *, exclusive: bool, wait: bool = True) -> Iterator[bool]:
    """The folder's lock, shared (readers) or exclusive (writers); yields whether it was taken
    (always, when `wait`)."""
    fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def make_folder(folder: Path) -> Path:
    """The snapshot folder (and its parent when missing), created private (0700)."""
    folder.parent.parent.mkdir(parents=True, exist_ok=True)
    for level in (folder.parent, folder):
        if not level.exists():
            level.mkdir(mode=0o700, exist_ok=True)
            os.chmod(level, 0o700)
    os.chmod(folder, 0o700)
    return folder


def generations(folder: Path) -> list[tuple[int, Path]]:
    """The snapshot files in `folder`, oldest generation first."""
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        stem = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else ""
        if stem.startswith("vectors-") and stem[8:].isdigit():
            found.append((int(stem[8:]), folder / name))
    return sorted(found)


def _aligned(offset: int, to: int = ALIGN) -> int:
    return (offset + to - 1) // to * to


def _padded(array: np.ndarray, count: int, fill: int = 0) -> np.ndarray:
    """`array`'s first axis extended to `count` with `fill` (the free rows)."""
    out = np.full((count,) + array.shape[1:], fill, dtype=array.dtype)
    out[:len(array)] = array
    return out


def write(folder: Path, generation: int, about: dict[str, Any], parts: Iterable[Part]) -> Path:
    """Write generation `generation` of the snapshot (`about`: instance, epoch, model, dim, form,
    mark) to a temporary file, then rename it into place; returns its path. `parts` are written
    one at a time as they come (a key's arrays need not be held beside the others'); the header,
    which says where each lies, goes after them. The caller holds the folder's lock exclusively."""
    path = folder / f"vectors-{generation}{SUFFIX}"
    temporary = folder / f".vectors-{generation}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(b"\0" * DATA_ALIGN)
            crc, at, table = 0, 0, []
            for key, ids, created, matrix, scales, codes, cap in parts:
                arrays: list[np.ndarray | None] = [
                    _padded(ids.astype(np.int64), cap, -1), _padded(created.astype(np.float64), cap), _padded(matrix, cap),
                    None if scales is None else _padded(scales.astype(np.float32), cap), None]
                if codes is not None:
                    wide = np.zeros((codes.shape[0], cap), dtype=np.uint64)
                    wide[:, :codes.shape[1]] = codes
                    arrays[4] = wide
                entry: list[Any] = [key, len(ids), cap]
                for array in arrays:
                    if array is None:
                        entry.append(-1)
                        continue
                    gap = b"\0" * (_aligned(at) - at)
                    body = np.ascontiguousarray(array).tobytes()
                    out.write(gap)
                    out.write(body)
                    crc = zlib.crc32(body, zlib.crc32(gap, crc))
                    entry.append(at + len(gap))
                    at += len(gap) + len(body)
                table.append(entry)
            header = json.dumps({**about, "generation": generation, "keys": table}).encode()
            out.write(header)
            out.seek(0)
            out.write(PREFIX.pack(MAGIC, VERSION, len(header), at, crc, zlib.crc32(header)))
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


@dataclass
class Mapped:
    """One generation, checked and mapped read-only (private: a process's appends stay its own)."""
    path: Path
    generation: int
    header: dict[str, Any]
    start: int
    buffer: mmap.mmap

    @property
    def mark(self) -> Any:
        """The change-log mark the snapshot reflects (a JSON list back as the tuple it was)."""
        mark = self.header["mark"]
        return tuple(mark) if isinstance(mark, list) else mark

    @property
    def rows(self) -> int:
        """How many vectors it holds over all keys."""
        return sum(int(entry[1]) for entry in self.header["keys"])

    def keys(self) -> Iterator[tuple[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                                                 np.ndarray | None, int]]]:
        """(key, (ids, created, rows, scales, codes, count)): views of the map, at the key's capacity."""
        dim, form = int(self.header["dim"]), str(self.header["form"])
        words = vector_codes.words_for(dim)
        for key, count, cap, ids_at, created_at, rows_at, scales_at, codes_at in self.header["keys"]:
            def view(dtype: Any, count_: int, at: int) -> np.ndarray:
                return np.frombuffer(self.buffer, dtype=dtype, count=count_, offset=self.start + at)
            matrix = view(np.int8 if form == "int8" else np.float32, cap * dim, rows_at).reshape(cap, dim)
            scales = view(np.float32, cap, scales_at) if scales_at >= 0 else None
            codes = view(np.uint64, words * cap, codes_at).reshape(words, cap) if codes_at >= 0 else None
            yield key, (view(np.int64, cap, ids_at), view(np.float64, cap, created_at), matrix, scales, codes, int(count))


def _read_prefix(buffer: Any, size: int) -> tuple[dict[str, Any], int, int, int]:
    """(header, data start, data length, data CRC) of a file; SnapshotProblem if it is not a whole snapshot."""
    if size < DATA_ALIGN:
        raise SnapshotProblem("truncated")
    magic, version, header_len, data_len, data_crc, header_crc = PREFIX.unpack_from(buffer, 0)
    if magic != MAGIC or version != VERSION:
        raise SnapshotProblem("not a snapshot of this format")
    if size != DATA_ALIGN + data_len + header_len:
        raise SnapshotProblem("truncated" if size < DATA_ALIGN + data_len + header_len else "of the wrong size")
    header_bytes = bytes(buffer[DATA_ALIGN + data_len:DATA_ALIGN + data_len + header_len])
    if zlib.crc32(header_bytes) != header_crc:
        raise SnapshotProblem("corrupt (header)")
    return json.loads(header_bytes), DATA_ALIGN, data_len, data_crc


def _crc(buffer: Any, start: int, length: int) -> int:
    crc = 0
    with memoryview(buffer) as whole:
        for at in range(start, start + length, CRC_BLOCK):
            crc = zlib.crc32(whole[at:min(start + length, at + CRC_BLOCK)], crc)
    return crc


def open_generation(path: Path, generation: int, expect: dict[str, Any]) -> Mapped:
    """Map and check one snapshot file: its prefix, header and size, the checksum of all its data,
    and that it is of the database, epoch, model, dimension and form in `expect`. SnapshotProblem
    when it is not fit to serve. The map keeps a shared lock on the file while it lives."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        size = os.fstat(fd).st_size
        if size == 0:
            raise SnapshotProblem("empty")
        buffer = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)  # its own descriptor holds the lock from now on
    finally:
        os.close(fd)
    header, start, data_len, data_crc = _read_prefix(buffer, size)
    for name, value in expect.items():
        if header.get(name) != value:
            raise SnapshotProblem(f"foreign ({name} {header.get(name)!r}, not {value!r})",
                                  keep=name != "instance" and _newer(header.get("epoch"), expect.get("epoch")))
    if _crc(buffer, start, data_len) != data_crc:
        raise SnapshotProblem("corrupt (checksum)")
    return Mapped(path, generation, header, start, buffer)


def _newer(epoch: Any, than: Any) -> bool:
    """Whether vector epoch `epoch` came after `than` (epochs count up with each new index)."""
    try:
        return int(epoch) > int(than)
    except (TypeError, ValueError):
        return False


def open_newest(folder: Path, expect: dict[str, Any]) -> Mapped | None:
    """The newest generation in `folder` fit to serve, or None. A file that is not (corrupt,
    truncated, foreign) is deleted with one log line: the next writer rebuilds it. The caller
    holds the folder's lock (shared is enough)."""
    for generation, path in reversed(generations(folder)):
        try:
            return open_generation(path, generation, expect)
        except FileNotFoundError:
            continue
        except SnapshotProblem as problem:
            if problem.keep:
                return None
            log.warning("vector snapshot %s is %s: deleted, it will be rebuilt", path, problem)
            path.unlink(missing_ok=True)
        except (ValueError, OSError) as problem:
            log.warning("vector snapshot %s is %s: deleted, it will be rebuilt", path, problem)
            path.unlink(missing_ok=True)
    return None


def discard(mapped: Mapped, why: str) -> None:
    """Delete a snapshot found unfit after it was opened (stale: the change log no longer reaches
    back to its mark), with one log line."""
    log.warning("vector snapshot %s is %s: deleted, it will be rebuilt", mapped.path, why)
    mapped.path.unlink(missing_ok=True)


def prune(folder: Path, keep: int) -> int:
    """Delete the generations older than `keep` that no process maps any more, and temporary
    files left by a writer that died; returns how many went. The caller holds the folder's lock exclusively."""
    gone = 0
    for generation, path in generations(folder):
        if generation >= keep:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)
            gone += 1
        except BlockingIOError:
            pass  # still mapped: the next prune
        finally:
            os.close(fd)
    for name in os.listdir(folder):
        if name.startswith(".vectors-") and name.endswith(".tmp"):
            (folder / name).unlink(missing_ok=True)
            gone += 1
    return gone


def scrub(folder: Path, live: np.ndarray) -> int:
    """Zero, in every generation in `folder`, the rows of vectors no longer stored (`live`: the
    ids that still have one): their id becomes -1 and their bytes zeros, in the file itself (the
    processes that map it see the zeros too; they dropped those rows when they applied the
    change). The checksum is written anew. Returns how many rows were zeroed. The caller holds
    the folder's lock exclusively."""
    zeroed = 0
    for _, path in generations(folder):
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            with mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE) as buffer:
                try:
                    header, start, data_len, _ = _read_prefix(buffer, size)
                except SnapshotProblem:
                    path.unlink(missing_ok=True)  # not serveable anyway: nothing of it may stay
                    continue
                found = _zero_removed(buffer, start, header, live)
                if found:
                    magic, version, header_len, _, _, header_crc = PREFIX.unpack_from(buffer, 0)
                    PREFIX.pack_into(buffer, 0, magic, version, header_len, data_len,
                                     _crc(buffer, start, data_len), header_crc)
                    buffer.flush()
                zeroed += found
        finally:
            os.close(fd)
    return zeroed


def _zero_removed(buffer: mmap.mmap, start: int, header: dict[str, Any], live: np.ndarray) -> int:
    dim, form = int(header["dim"]), str(header["form"])
    row_bytes = dim * (1 if form == "int8" else 4)
    words = vector_codes.words_for(dim)
    zeroed = 0
    for _, count, cap, ids_at, created_at, rows_at, scales_at, codes_at in header["keys"]:
        ids = np.frombuffer(buffer, dtype=np.int64, count=count, offset=start + ids_at)
        gone = np.flatnonzero((ids >= 0) & ~np.isin(ids, live))
        for row in gone.tolist():
            struct.pack_into("<q", buffer, start + ids_at + 8 * row, -1)
            struct.pack_into("<d", buffer, start + created_at + 8 * row, 0.0)
            at = start + rows_at + row * row_bytes
            buffer[at:at + row_bytes] = b"\0" * row_bytes
            if scales_at >= 0:
                struct.pack_into("<f", buffer, start + scales_at + 4 * row, 0.0)
            if codes_at >= 0:
                for word in range(words):
                    struct.pack_into("<Q", buffer, start + codes_at + 8 * (word * cap + row), 0)
        zeroed += len(gone)
        del ids
    return zeroed
