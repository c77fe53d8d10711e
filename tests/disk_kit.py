"""A disk that refuses writes, made without a mount: the kernel's file size limit.

With RLIMIT_FSIZE set, a write that would take a file past the limit fails with EFBIG, as
one on a full disk fails with ENOSPC, and the libraries say what they say on a full disk:
sqlite `disk I/O error`, OpenVINO `basic_ios::clear: iostream error`. It needs neither root
nor a tmpfs (CI may run as either, on a fresh machine), root is held to it too, and files
already past the limit can still be read. SIGXFSZ, which would end the process at the first
such write, is ignored meanwhile so that the write fails instead.
"""

from __future__ import annotations

import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def files_capped_at(limit_bytes: int) -> Iterator[None]:
    """Inside the block, no file of this process grows past `limit_bytes`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def cap_files(limit_bytes: int) -> None:
    """A child's `preexec_fn`: the same limit for the whole life of the process."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # stays ignored across exec
    resource.setrlimit(
        resource.RLIMIT_FSIZE, (limit_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
    )
