"""The prompt cache on disk (``[daemon] cache_dir``): rendered prompts kept across restarts.

One file per prompt, named by its key's digest (``<sha256>.prompt``), in the
format of ``bridge.providers.prompts.encode_prompt`` (magic, version,
lengths, CRC-32; the key material holds no secret). A file is written to a
temporary name, fsynced and renamed, so a crash leaves the old file or the
new one, never half of one; a file that does not decode (truncated,
corrupted, another version, a name that is not its key's digest) is logged,
deleted and rendered again when it is next needed. The store mirrors the
in-memory cache: what the cache evicts (least recently used, bounded in
bytes) is deleted here too, and at start-up the files are loaded oldest
first (by modification time), so the cache's bound holds on disk as well.

Everything here is blocking file I/O: the daemon runs ``apply`` in a worker
thread and ``load_into`` before it serves calls.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from bridge.engine import Event
from bridge.logs import get_logger
from bridge.providers.prompts import PromptCache, PromptFileError, PromptKey, decode_prompt
from bridge.providers.prompts import encode_prompt as encode

__all__ = ["SUFFIX", "PromptStore", "StoreWork"]

SUFFIX = ".prompt"
log = get_logger("callbridge.prompts")


@dataclass(slots=True)
class StoreWork:
    """What the cache did since the store last looked: files to write and to delete."""

    writes: list[tuple[str, PromptKey, list[Event]]]
    deletes: list[str]

    def __bool__(self) -> bool:
        return bool(self.writes or self.deletes)


class PromptStore:
    """Rendered prompts in one directory (module doc)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.written = 0
        self.deleted = 0
        self.bad = 0
        self.disk_bytes = 0
        """Bytes of the prompt files this store knows of (loaded or written, not deleted)."""
        self._sizes: dict[str, int] = {}

    def path(self, digest: str) -> Path:
        return self.directory / f"{digest}{SUFFIX}"

    def load_into(self, cache: PromptCache) -> int:
        """Load every good file into ``cache`` (oldest first); delete bad ones and what the
        cache's bound leaves out. The number of prompts loaded."""
        self.directory.mkdir(parents=True, exist_ok=True)
        cache.persist = True  # what it evicts from now on is deleted here too
        for tmp in self.directory.glob(f".*{SUFFIX}.tmp*"):  # a write a crash cut short
            with contextlib.suppress(OSError):
                tmp.unlink()
        files: list[tuple[float, Path]] = []
        for f in self.directory.glob(f"*{SUFFIX}"):
            with contextlib.suppress(OSError):
                files.append((f.stat().st_mtime, f))
        loaded = 0
        for _, f in sorted(files):
            try:
                data = f.read_bytes()
                key, events = decode_prompt(data)
                if f.name != f"{key.digest()}{SUFFIX}":
                    raise PromptFileError("file name is not its key's digest")
            except (OSError, PromptFileError) as e:
                self.bad += 1
                log.warning("prompt_store.bad_file", file=f.name, error=str(e))
                with contextlib.suppress(OSError):
                    f.unlink()
                continue
            self._sized(key.digest(), len(data))
            if cache.load(key, events):
                loaded += 1
        self.apply(StoreWork([], self.take(cache).deletes))  # what the bound left out
        log.info("prompt_store.loaded", directory=str(self.directory), prompts=loaded)
        return loaded

    @staticmethod
    def take(cache: PromptCache) -> StoreWork:
        """Drain what the cache stored and evicted (on the loop: pure data, no I/O)."""
        deletes = list(cache.evicted)
        gone = set(deletes)
        writes = [(d, k, r.events) for d, k, r in cache.stored if d not in gone]
        cache.stored.clear()
        cache.evicted.clear()
        return StoreWork(writes, deletes)

    def apply(self, work: StoreWork) -> None:
        """Write and delete files (blocking: run it in a worker thread)."""
        for digest, key, events in work.writes:
            try:
                self.write(digest, encode(key, events))
            except OSError as e:
                log.warning("prompt_store.write_failed", file=f"{digest}{SUFFIX}", error=str(e))
        for digest in work.deletes:
            with contextlib.suppress(FileNotFoundError):
                self.path(digest).unlink()
                self.deleted += 1
            self._sized(digest, 0)

    def _sized(self, digest: str, size: int) -> None:
        """The file of ``digest`` now holds ``size`` bytes (0: gone)."""
        self.disk_bytes += size - self._sizes.pop(digest, 0)
        if size:
            self._sizes[digest] = size

    def write(self, digest: str, data: bytes) -> None:
        """Write one file atomically: a temporary file, fsync, rename, fsync the directory."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path(digest)
        tmp = self.directory / f".{digest}{SUFFIX}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.close(fd)
        os.replace(tmp, final)
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self.written += 1
        self._sized(digest, len(data))
