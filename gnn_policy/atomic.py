"""Write a file so that a kill or a full disk leaves the old file or the new one, never half of one."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary name beside `path` to write to; it is renamed over `path` when the block
    ends, and removed if the block raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """`path.write_text(text)`, renamed into place."""
    with replacing(path) as tmp:
        tmp.write_text(text)
