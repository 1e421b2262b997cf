"""``--log FILE``: follow a vLLM log file the way ``tail -F`` would, but lose and double nothing.

What this module owns:

- **Waking up.** While the log is quiet, a watchdog (inotify) watch on the file's directory
  wakes ``wait()`` when the file is written, created, moved or deleted; ``wait()`` returns after
  ``poll_interval`` at the latest, which is the whole mechanism on filesystems without inotify
  (NFS, some FUSE and overlay mounts) or when watchdog cannot start (inotify watch limit).
  While lines keep coming (two polls in a row found some), the watch is dropped and the file is
  polled every ``busy_interval`` instead: watchdog turns every write into Python objects on two
  threads, which measured 5 % of a core at 500 lines/s (benchmarks/tail_footprint.py), while a
  poll that finds the next batch costs the same whatever the line rate. The watch is re-armed by
  the first poll that finds nothing, followed by one more poll, so no write falls between the
  two. No busy loop anywhere.
- **Reading.** ``poll()`` reads what is new with ``pread`` on an open descriptor and returns
  complete lines (``kvwatch.sources.lines``): a partial last line waits for its newline, lines
  are bounded, bytes are decoded with replacement.
- **Rotation.** Rename rotation and delete-and-recreate: the old file stays open and is read to
  its end (and watched for ``rotate_wait`` seconds, since a writer may still hold it) while the
  new file is read from its start. Copytruncate: the shrunk (or rewritten) file is read again
  from 0, and the bytes written between our last read and the copy are read from the copy,
  found next to the log by its content marks (plain, or gzipped by logrotate's ``compress``
  without ``delaycompress``, then decompressed) and read like a rotated-away file. A
  truncation that lands between our check and our read is caught by re-checking the marks
  after the read, and the read is taken back. A file that does not exist yet is waited for
  (``up=False``, no error).
- **Positions.** ``commit()`` saves, atomically (``write_atomically``: an ``O_EXCL|O_NOFOLLOW``
  temp file, fsync, ``os.replace``, fsync of the directory), the position after the
  last line ``poll()`` returned, for every file still being read, keyed by device/inode plus
  content marks: SHA-256 of the file's first 512 bytes and of the 512 bytes before that
  position (so a recreated file that reuses an inode, or a file rewritten by copytruncate,
  even with the same banner, is not mistaken for the old one). A restart resumes there:
  rotated files are found again by inode in the same directory (or the real file's, for a
  symlink). The file holds hashes and offsets only, never log text (logs can contain prompts),
  plus the caller's ``checkpoint`` (counters), saved in the same write. A corrupt or empty
  positions file is logged once and the current file is read from its start.

Exactly once: every line is returned once, provided the caller commits after processing each
batch; a batch returned but not committed before a crash is returned again after the restart.
- **Rotations never seen.** A rename rotation that hides another (a file renamed away, or
  copytruncated into a copy, before any look saw it at path), or any number of rotations while
  kvwatch was down, leave files we never opened. After a rename rotation (and at a restart),
  files next to the log with a rotation name of ours (``NAME.1``, ``NAME-20261201``), written
  since the look before, neither open, nor finished (remembered by identity and head hash, also
  in the positions), nor starting like a file we read, are read whole, oldest first. A file
  copytruncated and then renamed has its copy read from our offset before its new content.

Known limits: bytes a writer appends between logrotate's copy and its truncate are lost by
copytruncate itself; two copytruncates between two looks of a running follower (0.1 s apart
while the log is busy) lose what was written between them: the copy in the middle is told from
our own content only by marks a busy writer can have moved past, and reading it whole doubled
records under load; a rotated file moved to another directory, or compressed before we read
its end, cannot be found again after a restart (nor can an unseen rotation already compressed).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvwatch.errors import UsageError
from kvwatch.sources.lines import DEFAULT_MAX_LINE_BYTES, Line, LineSplitter, SourceStatus

#: How many leading bytes identify a file's content. Long enough to include a timestamp (vLLM
#: lines start "INFO 11-29 15:05:55 ..."), so two logs of the same server differ.
FINGERPRINT_BYTES = 512
#: One read; pread into a fresh bytes object, so this bounds a read's transient memory.
_CHUNK = 256 * 1024
#: Most bytes one poll reads; the rest waits for the next poll, which ``wait()`` makes immediate.
#: Keeps a ``--from-start`` over a multi-GB log from returning millions of lines at once.
_MAX_BATCH_BYTES = 8 << 20
_POSITIONS_VERSION = 1
log = logging.getLogger("kvwatch")
#: A rotated copy larger than this (compressed) is not decompressed to recover a tail: 1 GiB of
#: gzip is roughly 10 GiB of log, more than any one rotation period should hold.
_MAX_COMPRESSED_BYTES = 1 << 30
#: How far before our last look a file's mtime may lie and still count as written after it: the
#: kernel stamps files from a coarse clock (a jiffy behind time.time()), network filesystems from
#: the server's clock.
_MTIME_SLACK_SECONDS = 2.0
#: Rotated files read to their end and closed, remembered (identity and head) so a restart or a
#: later look never takes one of them for a rotation it has not seen.
_DONE_REMEMBERED = 64
#: A file whose first this-many bytes (or more) equal a known file's is that file or its copy.
_MIN_COPY_HEAD = 128


@dataclass(slots=True)
class _Open:
    """A file being read: its descriptor, identity, read offset and held partial line."""

    fd: int
    dev: int
    ino: int
    offset: int
    splitter: LineSplitter
    changed_at: float  # clock time it last grew (or was opened)
    fp_len: int = 0  # the fingerprint covers this many leading bytes ...
    fp_hash: str = ""  # ... whose SHA-256 is this
    tail_len: int = 0  # and this many bytes ending at tail_end (the last line returned) ...
    tail_hash: str = ""  # ... hash to this: log lines start alike, the bytes where we stand do not
    tail_end: int = 0
    detached_at: float | None = None  # clock time it was found no longer at the followed path
    skip_first: bool = False  # started mid-line (at the end of a file): drop that fragment

    @property
    def line_end(self) -> int:
        """Offset just after the last complete line returned (what a restart resumes from)."""
        return self.offset - self.splitter.held


@dataclass(frozen=True, slots=True)
class _Saved:
    dev: int
    ino: int
    offset: int
    fp_len: int
    fp_hash: str
    tail_len: int = 0
    tail_hash: str = ""


@dataclass(slots=True)
class _Counters:
    lines: int = 0
    truncated: int = 0
    rotations: int = 0
    truncations: int = 0
    copies_found: int = 0  # copytruncate: the copy was found and is read like a rotated file
    unseen_found: int = 0  # rotated files never seen at path (two rotations between looks), read whole
    restore_notes: list[str] = field(default_factory=list)


def _benign_watchdog_record(record: logging.LogRecord) -> bool:
    """Drop watchdog's ERROR about an emitter that ran once more after it was unscheduled.

    watchdog (seen with 7.1) logs "InotifyEmitter.queue_events() called when the thread is
    inactive" when an event arrives while a watch is being removed; we remove ours every time a
    quiet log turns busy, and the event is not needed (the busy timer polls), so it is noise.
    """
    return "called when the thread is inactive" not in record.getMessage()


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def positions_file(state_dir: Path, path: Path) -> Path:
    """Where the positions of ``path`` are kept under ``state_dir`` (one file per followed log)."""
    key = hashlib.sha256(os.fsencode(os.path.abspath(path))).hexdigest()[:16]
    return state_dir / f"tail-{key}.json"


class LogFollower:
    """Follow one log file across rotations; see the module docstring for the guarantees.

    ``path``: the log. ``state_dir``: where positions are kept (None: no persistence).
    ``from_start``: read what is already in the file; otherwise start at its end (a file that
    appears later, or a new file after rotation, is always read from its start; saved positions
    win over both). ``poll_interval``: the longest ``wait()`` blocks, and the only wake-up when
    ``use_watchdog`` is False. ``busy_interval``: how often to poll while lines keep coming.
    ``rotate_wait``: how long a rotated-away file is still read after it last grew.
    ``coalesce``: after a file event, how long ``wait()`` lets further writes land before
    returning (one poll per burst). ``clock``/``wall_clock``: injected time.
    """

    def __init__(
        self,
        path: Path,
        *,
        state_dir: Path | None = None,
        from_start: bool = False,
        poll_interval: float = 1.0,
        use_watchdog: bool = True,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        busy_interval: float = 0.1,
        rotate_wait: float = 5.0,
        coalesce: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self._name = self.path.name
        self._dir = self.path.parent
        self._max_line_bytes = max_line_bytes
        self._poll_interval = poll_interval
        self._rotate_wait = rotate_wait
        self._coalesce = coalesce
        self._busy_interval = busy_interval
        self._busy_polls = 0  # consecutive polls that found new bytes; 2+: poll on a timer, not on events
        self._closed = False
        # poll/commit/close may come from different threads (the sidecar's log loop, its stop()):
        # close must not free a descriptor that a poll is reading.
        self._lock = threading.RLock()
        self._clock = clock
        self._wall_clock = wall_clock
        self._current: _Open | None = None
        self._detached: list[_Open] = []
        self._error: str | None = None
        self._commit_error: str | None = None
        self._last_success_at: float | None = None
        self._counters = _Counters()
        self._bytes_this_poll = 0
        self._more = False  # the last poll stopped at its byte budget: wait() returns at once
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._observer: Any = None
        self._watches: list[Any] = []  # armed watchdog watches (empty while busy)
        self._watch_dirs: tuple[str, ...] = ()
        self._handler: Any = None
        self._use_watchdog = use_watchdog
        self._watch_note: str | None = None
        self._last_saved: str | None = None
        # Filesystem time (mtimes are wall clock, whatever clock is injected) of the look before
        # the latest one, and of the latest: a rotated file written after the former and never
        # seen at path was rotated away between two looks, and is read whole.
        self._looked_before: float = time.time()
        self._looked_at: float = self._looked_before
        # (dev, ino, fp_len, fp_sha256) of each rotated file read to its end.
        self._done: collections.deque[tuple[int, int, int, str]] = collections.deque(maxlen=_DONE_REMEMBERED)
        self._restored_look: float | None = None  # the last look before a restart, from the positions
        self._restoring = False
        self._copied_away: _Open | None = None  # marks of a file copytruncated, then renamed
        self._positions: Path | None = None
        self._positions_corrupt = False
        #: Set by the caller before ``commit()``: saved in the same atomic write as the positions,
        #: so counters derived from the lines read so far resume exactly where reading resumes.
        self.checkpoint: dict[str, Any] | None = None
        #: The checkpoint saved with the positions this follower resumed from (None: none saved).
        self.restored_checkpoint: dict[str, Any] | None = None
        if state_dir is not None:
            try:
                # 0700: the temp file and the positions live in a directory only we can write.
                Path(state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(
                    f"cannot use --state-dir {state_dir}: {exc.strerror or exc}; pass a writable directory"
                ) from None
            self._positions = positions_file(Path(state_dir), self.path)
        saved = self._load_positions()
        if saved is not None:
            self._restore(saved)
        elif not from_start and not self._positions_corrupt:
            self._open_current(at_end=True)
        # A corrupt or empty positions file says kvwatch was here before but not where: reading
        # the current file from its start loses nothing (it may re-read; starting at the end
        # would silently drop what was written while kvwatch was down).
        for note in self._counters.restore_notes:
            log.warning("source: %s", note)
        self._start_observer()
        if saved is None:
            # Record where we start (the end of the file, by default) at once: a restart before
            # the first commit then resumes here instead of at a later end, losing what came
            # between. Not after a restore: lines recovered from a copy are not delivered yet,
            # and the saved positions must keep pointing before them until they are.
            self.commit()

    # ------------------------------------------------------------------ public

    def poll(self) -> list[Line]:
        """Every line completed since the last poll, oldest file first; never blocks."""
        with self._lock:
            return [] if self._closed else self._poll()

    def _poll(self) -> list[Line]:
        lines: list[Line] = []
        budget = _MAX_BATCH_BYTES
        now = self._clock()
        self._bytes_this_poll = 0
        self._looked_before, self._looked_at = self._looked_at, time.time()
        self._check_path(now)
        for f in list(self._detached):
            budget -= self._read(f, lines, budget, now)
            if now - max(f.detached_at or now, f.changed_at) >= self._rotate_wait and budget > 0:
                self._finish(f, lines)
        cur = self._current
        if cur is not None:
            budget -= self._read(cur, lines, budget, now)
            if self._error is None:
                self._last_success_at = self._wall_clock()
        self._more = budget <= 0
        self._busy_polls = self._busy_polls + 1 if self._bytes_this_poll else 0
        if self._use_watchdog and self._observer is None:
            self._start_observer()  # the directory may have appeared since
        self._counters.lines += len(lines)
        self._counters.truncated += sum(1 for line in lines if line.truncated)
        return lines

    def wait(self, timeout: float) -> bool:
        """Block until the file may have changed (True) or the interval passes (False).

        The interval is ``busy_interval`` while lines keep coming, else ``poll_interval``; never
        more than ``timeout``. Call ``poll()`` after it either way.
        """
        if self._more:
            self._more = False
            return True
        # With a watch, wait for a second busy poll: a lone stats line is not worth dropping the
        # watch for. Without one, any new data means more is likely: look again soon.
        if self._busy_polls >= (2 if self._observer is not None else 1):
            self._disarm()
            self._stop.wait(max(0.0, min(timeout, self._busy_interval)))
            return False
        if self._arm():
            return True  # a write may have landed before the watch existed: look once more
        woke = self._wake.wait(max(0.0, min(timeout, self._poll_interval)))
        if woke and self._coalesce > 0:
            self._stop.wait(min(self._coalesce, timeout))
        self._wake.clear()
        return woke

    def commit(self) -> None:
        """Persist the position after the last line returned by ``poll()`` (atomic; no-op if unchanged).

        Call it once the lines returned so far have been processed: a restart resumes here.
        """
        with self._lock:
            if self._positions is not None and not self._closed:
                self._commit(self._positions)

    def _commit(self, positions: Path) -> None:
        files = [*self._detached, *([self._current] if self._current is not None else [])]
        doc: dict[str, Any] = {
            "version": _POSITIONS_VERSION,
            "path": os.path.abspath(self.path),
            "files": [
                {
                    "dev": f.dev,
                    "ino": f.ino,
                    "offset": f.line_end,
                    "fp_len": f.fp_len,
                    "fp_sha256": f.fp_hash,
                    "tail_len": f.tail_len if f.tail_end == f.line_end else 0,
                    "tail_sha256": f.tail_hash if f.tail_end == f.line_end else "",
                }
                for f in files
            ],
        }
        # What a restart needs to find rotations it never saw: when we last looked, and which
        # rotated files are finished (never their names or content).
        doc["looked_at"] = self._looked_at
        doc["done"] = [list(d) for d in self._done]
        if self.checkpoint is not None:
            doc["checkpoint"] = self.checkpoint
        text = json.dumps(doc, sort_keys=True)
        if text == self._last_saved:
            return
        try:
            write_atomically(positions, text.encode("utf-8"))
        except OSError as exc:
            self._commit_error = f"cannot save log positions to {positions}: {exc.strerror or exc}"
            return
        self._commit_error = None
        self._last_saved = text

    def close(self) -> None:
        """Stop the observer and close every descriptor. Does not commit."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            self._close()

    def _close(self) -> None:
        self._closed = True
        if self._observer is not None:
            with contextlib.suppress(Exception):  # shutting down: nothing useful to do with it
                self._observer.stop()
                self._observer.join(timeout=5)
            self._observer = None
        for f in [*self._detached, *([self._current] if self._current is not None else [])]:
            with contextlib.suppress(OSError):
                os.close(f.fd)
        self._detached.clear()
        self._current = None

    def status(self) -> SourceStatus:
        """Up while the file at ``path`` is open and readable; a missing file is down without error."""
        return SourceStatus(
            up=self._current is not None and self._error is None,
            last_error=self._error or self._commit_error,
            last_success_at=self._last_success_at,
            lines_total=self._counters.lines,
            truncated_lines_total=self._counters.truncated,
            mode="inotify" if self._observer is not None else "poll",
        )

    @property
    def up(self) -> bool:
        """Shorthand for ``status().up``."""
        return self._current is not None and self._error is None

    @property
    def last_error(self) -> str | None:
        """Shorthand for ``status().last_error``: None when readable or merely not there yet."""
        return self._error or self._commit_error

    @property
    def armed(self) -> bool:
        """True while a file-event watch is in place (quiet log); False while polling on a timer."""
        return bool(self._watches)

    @property
    def notes(self) -> tuple[str, ...]:
        """Things worth one log line of kvwatch's own: watchdog fallback, positions not restored."""
        notes = list(self._counters.restore_notes)
        if self._watch_note:
            notes.append(self._watch_note)
        return tuple(notes)

    @property
    def rotations(self) -> tuple[int, int]:
        """(rename/delete rotations, truncations) seen since start."""
        return self._counters.rotations, self._counters.truncations

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the file at path

    def _stat_path(self) -> os.stat_result | None:
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            self._error = f"cannot read {self.path}: {exc.strerror or exc}"
            return None
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            self._error = f"{self.path} is {kind}; pass the log file itself (or --log - for a pipe)"
            return None
        return st

    def _check_path(self, now: float) -> None:
        """Notice rotation, deletion, truncation; open the file at path when there is one."""
        self._error = None
        st = self._stat_path()
        cur = self._current
        if cur is not None and (st is None or (st.st_dev, st.st_ino) != (cur.dev, cur.ino)):
            # Renamed away or deleted: keep reading the open descriptor for a while. If it was
            # copytruncated first, the copy holds what follows our offset: it comes first.
            copied = self._check_truncated(cur, now)
            cur.detached_at = now
            self._detached.append(cur)
            self._current = cur = None
            self._counters.rotations += 1
            self._copied_away = copied
        if cur is None and st is not None:
            back = [f for f in self._detached if (f.dev, f.ino) == (st.st_dev, st.st_ino)]
            if back:  # renamed away and back again: the same file, keep its position
                self._current = back[0]
                self._detached.remove(back[0])
                self._current.detached_at = None
            else:
                self._open_current(at_end=False)
            # A rename since our last look may hide another: a file renamed (or copytruncated)
            # away before we ever saw it at path.
            also, self._copied_away = ((self._copied_away,) if self._copied_away else ()), None
            self._recover_unseen(self._looked_before, now, also=also)
            return
        if cur is not None:
            self._check_truncated(cur, now)

    def _open_current(self, *, at_end: bool) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return
        except OSError as exc:
            self._error = f"cannot read {self.path}: {exc.strerror or exc}; give kvwatch read access"
            return
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self._stat_path()  # sets the error message
            return
        f = _Open(fd, st.st_dev, st.st_ino, 0, LineSplitter(self._max_line_bytes), self._clock())
        if at_end and st.st_size:
            f.offset = st.st_size
            f.skip_first = os.pread(fd, 1, st.st_size - 1) != b"\n"
        self._refresh_fingerprint(f)
        self._current = f

    def _check_truncated(self, cur: _Open, now: float) -> _Open | None:
        """Copytruncate: the file shrank below our offset, or the bytes we remember changed.

        Returns the marks of the content that was copied away (None: not truncated), so a look
        for unseen rotations can tell that content's copy from a file it never saw.
        """
        try:
            size = os.fstat(cur.fd).st_size
            replaced = not _same_content(cur.fd, cur)
        except OSError as exc:
            self._error = f"cannot read {self.path}: {exc.strerror or exc}"
            return None
        if size >= cur.offset and not replaced:
            return None
        self._counters.truncations += 1
        before = dataclasses.replace(cur)  # the marks of the content that was copied away
        self._adopt_copy(cur, now)
        cur.offset = 0
        cur.splitter = LineSplitter(self._max_line_bytes)
        cur.fp_len, cur.fp_hash = 0, ""
        cur.tail_len, cur.tail_hash, cur.tail_end = 0, "", 0
        cur.changed_at = now
        cur.skip_first = False
        # Not followed by a look for unseen rotations: two copytruncates between two looks
        # stay the known limit (module docstring), since a copy is only told from an unseen
        # file by marks a busy writer may have moved past.
        return before

    def _adopt_copy(self, cur: _Open, now: float) -> None:
        """Read the rest of the truncated content from logrotate's copy, as a rotated-away file.

        The copy holds the same bytes up to where the truncation happened, so it continues from
        our offset with our held partial line; as a detached file it is read within the poll
        budget and its position is saved like any other (a restart finishes it).
        """
        copy = self._find_by_content(cur, cur.offset, exclude=(cur.dev, cur.ino))
        if copy is None:
            return  # its unread end is lost, and so is the partial line we held
        fd, st = copy
        self._counters.copies_found += 1
        self._detached.append(
            _Open(
                fd,
                st.st_dev,
                st.st_ino,
                cur.offset,
                cur.splitter,
                now,
                cur.fp_len,
                cur.fp_hash,
                cur.tail_len,
                cur.tail_hash,
                cur.tail_end,
                detached_at=now,
                skip_first=cur.skip_first,
            )
        )

    def _find_by_content(
        self, marks: _Open, min_size: int, *, exclude: tuple[int, int]
    ) -> tuple[int, os.stat_result] | None:
        """An open descriptor and stat of the newest sibling file with the same content marks."""
        if not marks.fp_len:
            return None
        best: tuple[float, str] | None = None
        for entry in self._siblings():
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) == exclude or st.st_size < min_size:
                    continue
                with open(entry.path, "rb") as fh:
                    if not _same_content(fh.fileno(), marks):
                        continue
            except OSError:
                continue
            if best is None or st.st_mtime > best[0]:
                best = (st.st_mtime, entry.path)
        if best is None:
            # logrotate's "compress" without "delaycompress" gzips the copy right after the
            # truncate and deletes it (logrotate.c: compressLogFile runs in the same rotation,
            # unlinking the plain copy once the .gz is written), often before our next poll.
            return self._find_compressed(marks, min_size)
        try:
            fd = os.open(best[1], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        return fd, os.fstat(fd)

    def _find_compressed(self, marks: _Open, min_size: int) -> tuple[int, os.stat_result] | None:
        """The copy, gzipped: its unread part decompressed into a private sparse file, same offsets.

        Only the head (for the fingerprint), the remembered tail and what follows ``min_size``
        (our offset) are written, each at its own offset, so the bytes already read cost no disk
        and the file is read like any other detached file. Its identity is the temporary file's,
        so a restart cannot find it again (the compressed copy is then lost past the restart;
        docs/deploy.md says so).
        """
        candidates = []
        for entry in self._siblings():
            if not entry.name.endswith(".gz"):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_size <= _MAX_COMPRESSED_BYTES:
                    candidates.append((st.st_mtime, entry.path))
        for _, name in sorted(candidates, reverse=True):  # the newest copy is the likeliest
            found = _decompress_tail(name, marks, min_size)
            if found is not None:
                return found
        return None

    def _recover_unseen(self, since: float, now: float, also: tuple[_Open, ...] = ()) -> None:
        """Read whole the rotated files written since ``since`` that were never at path when we looked.

        Two rotations between two looks (a rename, then the new file renamed or copytruncated
        before we saw it; or kvwatch down across them) leave a file we never opened and have no
        marks for. Only names logrotate and the kubelet give rotations of this file
        (``NAME.1``, ``NAME-20261201``, ``NAME.20261201-120000``), written after our last look
        (mtime, with ``_MTIME_SLACK_SECONDS``), that are neither open, nor finished
        (``_done``), nor a copy of a file we are reading (its content marks: ``_adopt_copy``
        takes those from our offset). Oldest first, after the files already detached.
        """
        if self._restoring:
            return
        open_ids = {(f.dev, f.ino) for f in [*self._detached, *([self._current] if self._current else [])]}
        done = list(self._done)
        marked = [f for f in [*self._detached, *([self._current] if self._current else []), *also] if f.fp_len]
        found: list[tuple[float, int, os.stat_result]] = []
        for entry in self._siblings():
            if not self._is_rotation_name(entry.name):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or not st.st_size or st.st_mtime < since - _MTIME_SLACK_SECONDS:
                    continue
                if (st.st_dev, st.st_ino) in open_ids:
                    continue
                fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                if self._unseen(fd, st, done, marked):
                    found.append((st.st_mtime, fd, st))
                else:
                    os.close(fd)
        for _, fd, st in sorted(found, key=lambda x: x[0]):
            f = _Open(fd, st.st_dev, st.st_ino, 0, LineSplitter(self._max_line_bytes), now, detached_at=now)
            self._refresh_fingerprint(f)
            self._detached.append(f)
            self._counters.unseen_found += 1

    def _is_rotation_name(self, name: str) -> bool:
        """A name logrotate or the kubelet gives a rotation of this file (not compressed)."""
        real = os.path.basename(os.path.realpath(self.path))
        if name.endswith(".gz"):
            return False
        return any(name.startswith((base + ".", base + "-")) for base in {self._name, real})

    @staticmethod
    def _unseen(fd: int, st: os.stat_result, done: list[tuple[int, int, int, str]], marked: list[_Open]) -> bool:
        """Whether the file open on ``fd`` (stat ``st``, by name) is a rotation we never read.

        Not if it starts like a file we read or are reading: then it is that file, renamed, or a
        copy of it (logrotate's copytruncate copy, maybe still being written, so its tail cannot
        be compared yet). A head shorter than ``_MIN_COPY_HEAD`` says too little (vLLM lines
        start alike), so such a file must match the whole marks.
        """
        try:
            fst = os.fstat(fd)
            if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                return False  # renamed again between the stat and the open: the next look finds it
            for d, i, n, h in done:
                # A finished file renamed again (logrotate shifts .1 to .2): the same inode with the
                # same head, however short that head was when we finished it.
                if (d, i) == (st.st_dev, st.st_ino) and _hash(os.pread(fd, n, 0)) == h:
                    return False
            heads = [(f.fp_len, f.fp_hash) for f in marked] + [(n, h) for _d, _i, n, h in done]
            for length, digest in heads:
                if length >= _MIN_COPY_HEAD and _hash(os.pread(fd, length, 0)) == digest:
                    return False
            return not any(_same_content(fd, f) for f in marked)
        except OSError:
            return False

    def _siblings(self) -> list[os.DirEntry[str]]:
        """Files next to the log whose names share its stem: where logrotate puts rotated copies.

        Next to the real file when ``path`` is a symlink (Kubernetes' /var/log/containers/*.log
        point into /var/log/pods/..., where the kubelet rotates).
        """
        real = os.path.realpath(self.path)
        directory, name = os.path.dirname(real), os.path.basename(real)
        stem = name.split(".", 1)[0]
        try:
            with os.scandir(directory) as it:
                return [e for e in it if e.name not in (name, self._name) and (not stem or e.name.startswith(stem))]
        except OSError:
            return []

    # ------------------------------------------------------------------ reading

    def _read(self, f: _Open, out: list[Line], budget: int, now: float) -> int:
        """Read ``f`` from its offset to EOF (or the budget) into ``out``; returns bytes read."""
        start, offset, held = len(out), f.offset, f.splitter.state()
        got = self._read_raw(f, out, budget)
        if got and f is self._current and not _same_content(f.fd, f):
            # Copytruncated, and regrown past our offset, between the check and the read: what
            # was read is new content at an old offset. Forget it and take the truncation path.
            del out[start:]
            f.offset = offset
            f.splitter.restore(held)
            copies = len(self._detached)
            self._check_truncated(f, now)
            for copy in self._detached[copies:]:  # the old content's end comes first
                budget -= self._read(copy, out, budget, now)
            got = self._read_raw(f, out, budget)
        if got:
            f.changed_at = now
            if f.skip_first and len(out) > start:
                del out[start]
                f.skip_first = False
            if f.fp_len < FINGERPRINT_BYTES:
                self._refresh_fingerprint(f)
            if f.tail_end != f.line_end:
                _mark_tail(f)
        return got

    def _read_raw(self, f: _Open, out: list[Line], budget: int) -> int:
        got = 0
        while got < budget:
            try:
                data = os.pread(f.fd, _CHUNK, f.offset)
            except OSError as exc:
                self._error = f"cannot read {self.path}: {exc.strerror or exc}"
                break
            if not data:
                break
            if data[:1] == b"\0" and not f.splitter.held:
                # A hole left by a non-O_APPEND writer after copytruncate: jump to its data.
                skip = _next_data(f.fd, f.offset)
                if skip > f.offset:
                    f.offset = skip
                    continue
            f.offset += len(data)
            got += len(data)
            self._bytes_this_poll += len(data)
            out.extend(f.splitter.feed(data))
        return got

    def _refresh_fingerprint(self, f: _Open) -> None:
        try:
            head = os.pread(f.fd, FINGERPRINT_BYTES, 0)
        except OSError:
            return
        f.fp_len, f.fp_hash = len(head), _hash(head)

    def _finish(self, f: _Open, out: list[Line]) -> None:
        """A rotated file has been quiet for ``rotate_wait``: deliver its last partial line, close it."""
        tail = f.splitter.flush()
        if tail is not None and not f.skip_first:
            out.append(tail)
        with contextlib.suppress(OSError):
            os.close(f.fd)
        self._detached.remove(f)
        self._done.append((f.dev, f.ino, f.fp_len, f.fp_hash))

    # ------------------------------------------------------------------ positions

    def _load_positions(self) -> list[_Saved] | None:
        if self._positions is None:
            return None
        try:
            text = _read_no_follow(self._positions)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._positions_corrupt = True
            self._counters.restore_notes.append(
                f"cannot read positions file {self._positions} ({exc.strerror or exc}); "
                f"reading {self.path} from its start"
            )
            return None
        try:
            doc = json.loads(text)
            if doc.get("version") != _POSITIONS_VERSION:
                raise ValueError(f"version {doc.get('version')!r}")
            saved = [
                _Saved(
                    int(e["dev"]),
                    int(e["ino"]),
                    int(e["offset"]),
                    int(e["fp_len"]),
                    str(e["fp_sha256"]),
                    int(e.get("tail_len", 0)),
                    str(e.get("tail_sha256", "")),
                )
                for e in doc["files"]
            ]
            checkpoint = doc.get("checkpoint")
            if checkpoint is not None and not isinstance(checkpoint, dict):
                raise ValueError("checkpoint is not an object")
            looked_at = doc.get("looked_at")
            looked_at = float(looked_at) if looked_at is not None else None
            done = [(int(d), int(i), int(n), str(h)) for d, i, n, h in doc.get("done", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._positions_corrupt = True
            reason = "empty" if not text.strip() else str(exc)[:100]
            self._counters.restore_notes.append(
                f"ignored unreadable positions file {self._positions} ({reason}); reading {self.path} from its start"
            )
            return None
        self._last_saved = text
        self.restored_checkpoint = checkpoint
        self._done.extend(done)
        self._restored_look = looked_at
        return saved

    def _restore(self, saved: list[_Saved]) -> None:
        """Reopen every saved file where it is now (at path or renamed next to it), at its offset."""
        now = self._clock()
        self._restoring = True  # not every saved file is open yet: look for unseen ones after
        befores: list[_Open] = []  # marks of content copytruncated away while we were down
        if self._restored_look is not None:
            # Rotations since the last look before the restart are looked for from there.
            self._looked_before = self._looked_at = self._restored_look
        st = self._stat_path()
        for s in saved:
            f = self._reopen(s, st, now)
            if f is None:
                self._counters.restore_notes.append(
                    f"a log file read before the restart (inode {s.ino}) is gone; its unread end is lost"
                )
                continue
            if st is not None and (f.dev, f.ino) == (st.st_dev, st.st_ino):
                self._current = f
            else:
                if (copied := self._check_truncated(f, now)) is not None:  # copytruncated, then renamed
                    befores.append(copied)  # its copy comes first
                f.detached_at = now
                self._detached.append(f)
        copied = self._check_truncated(self._current, now) if self._current is not None else None
        if copied is not None:
            befores.append(copied)
        self._restoring = False
        if self._restored_look is not None:
            # Files rotated away while we were down, never seen: older than the file at path.
            self._recover_unseen(self._restored_look, now, also=tuple(befores))
        if self._current is None and st is not None:
            # The file at path is not one we read before: it was created since, all of it is new.
            self._open_current(at_end=False)

    def _named_by_identity(self, s: _Saved, at_path: bool) -> Iterator[str]:
        if at_path:
            yield str(self.path)
        for entry in self._siblings():
            with contextlib.suppress(OSError):
                est = entry.stat(follow_symlinks=False)
                if (est.st_dev, est.st_ino) == (s.dev, s.ino):
                    yield entry.path

    def _reopen(self, s: _Saved, st: os.stat_result | None, now: float) -> _Open | None:
        """Open the saved file by identity: at path if it is still there, else among its siblings.

        Siblings are looked at even when the stat said "at path": the file may have been renamed
        between that stat and our open.
        """
        at_path = st is not None and (st.st_dev, st.st_ino) == (s.dev, s.ino)
        for name in self._named_by_identity(s, at_path):
            try:
                fd = os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                continue
            fst = os.fstat(fd)
            if (fst.st_dev, fst.st_ino) != (s.dev, s.ino):
                os.close(fd)
                continue
            f = _Open(fd, s.dev, s.ino, s.offset, LineSplitter(self._max_line_bytes), now, s.fp_len, s.fp_hash)
            f.tail_len, f.tail_hash, f.tail_end = s.tail_len, s.tail_hash, s.offset
            if name == str(self.path) or self._is_rotation_name(os.path.basename(name)):
                # Content changes (copytruncate, before or after a rename) are checked by the caller.
                return f
            if fst.st_size < s.offset or not _same_content(fd, f):
                os.close(fd)  # the inode was reused by an unrelated file
                continue
            return f
        return None

    # ------------------------------------------------------------------ watchdog

    def _start_observer(self) -> None:
        """Start the watchdog observer (no watch yet: ``_arm`` adds it while the log is quiet)."""
        if not self._use_watchdog or self._observer is not None:
            return
        try:
            from watchdog.events import FileSystemEvent, FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError as exc:  # pragma: no cover - watchdog is a dependency
            self._watch_note = f"file events unavailable ({exc}); polling every {self._poll_interval:g}s"
            self._use_watchdog = False
            return
        real = Path(os.path.realpath(self.path))
        dirs = tuple(sorted({str(self._dir), str(real.parent)}))
        names = {self._name, real.name}
        if not all(os.path.isdir(d) for d in dirs):
            return  # retried from poll() once the directory exists
        wake = self._wake

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                for p in (event.src_path, getattr(event, "dest_path", "")):
                    if p and os.path.basename(os.fsdecode(p)) in names:
                        wake.set()
                        return

        inotify_log = logging.getLogger("watchdog.observers.inotify")
        if _benign_watchdog_record not in inotify_log.filters:
            inotify_log.addFilter(_benign_watchdog_record)
        try:
            observer = Observer()
            observer.daemon = True
            observer.start()
        except Exception as exc:  # no inotify here: polling still works
            self._watch_note = f"file events unavailable ({exc}); polling every {self._poll_interval:g}s"
            self._use_watchdog = False
            return
        self._observer, self._handler, self._watch_dirs = observer, _Handler(), dirs
        self._arm()

    def _arm(self) -> bool:
        """Watch the directory for events; True if the watch is new (not already armed)."""
        if self._observer is None or self._watches:
            return False
        from watchdog.events import FileCreatedEvent, FileDeletedEvent, FileModifiedEvent, FileMovedEvent

        # Only the events that can mean new data: skips open/close/access churn.
        kinds = [FileModifiedEvent, FileCreatedEvent, FileMovedEvent, FileDeletedEvent]
        try:
            for d in self._watch_dirs:
                self._watches.append(self._observer.schedule(self._handler, d, recursive=False, event_filter=kinds))
        except Exception as exc:  # inotify watch limit, directory gone: the poll interval still works
            self._watch_note = f"file events unavailable ({exc}); polling every {self._poll_interval:g}s"
            self._disarm()
            return False
        return True

    def _disarm(self) -> None:
        """Drop the watches while the log is busy: polling on a timer is cheaper than an event per write."""
        for watch in self._watches:
            with contextlib.suppress(Exception):  # already gone with its directory
                self._observer.unschedule(watch)
        self._watches.clear()


def _private_file() -> int:
    """A descriptor of an anonymous, sparse, private file: memfd (Linux; needs no writable
    directory, e.g. a read-only root filesystem), else an unlinked mkstemp file (O_EXCL, 0600).
    Only our descriptor holds it, so nothing is left behind by a crash."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        with contextlib.suppress(OSError):
            return int(memfd_create("kvwatch-gz", getattr(os, "MFD_CLOEXEC", 0)))
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix="kvwatch-gz-")
    os.unlink(tmp)
    return fd


def _decompress_tail(name: str, marks: _Open, min_size: int) -> tuple[int, os.stat_result] | None:
    """Decompress ``name`` if it starts and continues like ``marks``; see ``_find_compressed``."""
    import gzip
    import zlib

    head_end = marks.fp_len
    tail_start = marks.tail_end - marks.tail_len if marks.tail_len else min_size
    keep_from = min(tail_start, min_size)
    fd = -1
    try:
        with gzip.open(name, "rb") as gz:
            head = gz.read(head_end)
            if _hash(head) != marks.fp_hash:
                return None  # another rotation's copy: its first bytes differ
            fd = _private_file()
            os.pwrite(fd, head, 0)
            pos = len(head)
            while True:
                chunk = gz.read(_CHUNK)
                if not chunk:
                    break
                end = pos + len(chunk)
                if end > keep_from:
                    start = max(pos, keep_from)
                    os.pwrite(fd, chunk[start - pos :], start)
                pos = end
        if pos < min_size:
            os.close(fd)
            return None
        os.ftruncate(fd, pos)
        st = os.fstat(fd)
        probe = _Open(fd, st.st_dev, st.st_ino, 0, LineSplitter(), 0.0, marks.fp_len, marks.fp_hash)
        probe.tail_len, probe.tail_hash, probe.tail_end = marks.tail_len, marks.tail_hash, marks.tail_end
        if not _same_content(fd, probe):
            os.close(fd)
            return None
        return fd, st
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        # Being written (logrotate's gzip still running) or damaged: not the copy we can use.
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        return None


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content, never a mix.

    The temporary file is created ``O_EXCL | O_NOFOLLOW``: a symlink (or anything) planted at
    its predictable name is removed as a name and never written through. The data is fsynced
    before the rename and the directory after it, so a power loss cannot leave an empty file.
    """
    tmp = path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:
        # Left by a crash between create and rename, or planted: unlink removes the name itself
        # (a symlink, not its target), then O_EXCL makes sure we create the file we write.
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        dfd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _read_no_follow(path: Path) -> str:
    """A small state file's text, refusing a symlink in its place (ELOOP) rather than following it."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        return fh.read(16 << 20).decode("utf-8", errors="replace")


def _mark_tail(f: _Open) -> None:
    """Remember the hash of the bytes just before the last line end (up to FINGERPRINT_BYTES)."""
    end = f.line_end
    start = max(0, end - FINGERPRINT_BYTES)
    try:
        data = os.pread(f.fd, end - start, start)
    except OSError:
        return
    f.tail_len, f.tail_hash, f.tail_end = len(data), _hash(data), end


def _same_content(fd: int, marks: _Open) -> bool:
    """Whether the file behind ``fd`` still holds the bytes ``marks`` remembers (head and tail)."""
    if marks.fp_len and _hash(os.pread(fd, marks.fp_len, 0)) != marks.fp_hash:
        return False
    if marks.tail_len:
        data = os.pread(fd, marks.tail_len, marks.tail_end - marks.tail_len)
        if _hash(data) != marks.tail_hash:
            return False
    return True


def _next_data(fd: int, offset: int) -> int:
    """The next offset holding data at or after ``offset`` (skips a sparse hole), or ``offset``."""
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None:
        return offset
    try:
        return os.lseek(fd, offset, seek_data)
    except OSError:
        return offset
