"""Processes read from ``/proc``: their state and parent, and the tree below one."""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: the state first, then the
    parent's pid. ``OSError`` once the process has ended (or is not ours to read)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def command_line(pid: int | str) -> bytes:
    """``/proc/<pid>/cmdline``, its arguments separated by NUL; empty once it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int(stat_fields(entry.name)[1])
            except (OSError, IndexError, ValueError):  # ended meanwhile
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def cpu_seconds(pids: set[int]) -> float:
    """The CPU time (user and system) the processes ``pids`` have used so far; an ended
    one counts nothing."""
    ticks = 0
    for pid in pids:
        try:
            fields = stat_fields(pid)
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return ticks / os.sysconf("SC_CLK_TCK")
