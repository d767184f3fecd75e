"""Who holds a Milvus Lite data dir: Lite opens a data dir in one process only, under an advisory ``flock``.

Standard library only, so a command can ask before it loads pymilvus (``lookup`` finding a running ``serve``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

#: Milvus Lite's advisory lock file inside its data dir, held (flock) by the process that has the dir open.
LITE_LOCK_FILE = "LOCK"


def lite_lock_holder(data_dir: Path) -> int | None:
    """``None`` when no other process holds the Milvus Lite data dir; else the holder's PID (0 when unknown).

    Probes the lock the way Milvus Lite takes it (a non-blocking exclusive ``flock``) and lets it go at once.
    Only meaningful when this process does not hold the dir itself.
    """
    lock = data_dir / LITE_LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return None  # no lock file: nobody has opened the dir yet
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return None
        return _flock_owner(os.fstat(fd).st_ino) or 0
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _flock_owner(inode: int) -> int | None:
    """The PID holding a ``flock`` on the file with this inode, from ``/proc/locks`` (Linux; else ``None``)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            # "1: FLOCK  ADVISORY  WRITE 6062 fe:00:2154548 0 EOF"
            if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
                with contextlib.suppress(ValueError):
                    return int(parts[4])
    return None
