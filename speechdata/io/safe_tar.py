"""Read audio out of an untrusted tar without ever letting a member name choose where bytes go.

``tarfile.extractall`` trusts member names: ``../../etc/cron.d/x``, ``/abs/path``, a symlink
followed by a file written through it, or a device node all escape or damage the destination.
Here every member is audited first; only regular files with a plain relative name are readable, and
the caller chooses every output path itself (from a validated ``utt_id``). Each unsafe member comes
back with a stable reason code, so it can be reported and never silently skipped.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
from dataclasses import dataclass

_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class UnsafeMember:
    name: str
    reason: str
    detail: str


def member_name_problem(name: str) -> str | None:
    """Why ``name`` is not a plain relative path inside the archive, or None."""
    if not name or name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "absolute path"
    parts = name.replace("\\", "/").removeprefix("./").split("/")
    if any(part == ".." for part in parts):
        return "'..' component"
    if "\x00" in name:
        return "NUL byte"
    return None


def audit_member(member: tarfile.TarInfo) -> UnsafeMember | None:
    """None for a regular file with a safe name; otherwise the reason it must not be read."""
    problem = member_name_problem(member.name)
    if problem is not None:
        return UnsafeMember(member.name, "tar_member_unsafe_path", f"{member.name!r}: {problem}")
    if member.issym() or member.islnk():
        return UnsafeMember(member.name, "tar_member_is_link", f"{member.name!r} links to {member.linkname!r}")
    if member.ischr() or member.isblk() or member.isfifo():
        return UnsafeMember(member.name, "tar_member_is_device", f"{member.name!r} is a device or FIFO")
    if not member.isreg():
        return UnsafeMember(member.name, "tar_member_not_a_file", f"{member.name!r} has tar type {member.type!r}")
    return None


def member_key(name: str) -> str:
    """The name metadata uses for a member (``./a/b.flac`` is ``a/b.flac``)."""
    return posixpath.normpath(name.removeprefix("./"))


@dataclass
class TarAudit:
    """The archive's readable members by name, and every member that is not readable, with why.

    A name that appears both as a regular file and as something unsafe (a classic trick: a file,
    then a symlink of the same name) is unsafe as a whole.
    """

    files: dict[str, tarfile.TarInfo]
    unsafe: dict[str, UnsafeMember]


def audit_tar(tar: tarfile.TarFile) -> TarAudit:
    """Audit every member. Two members with one name are ambiguous (``tarfile`` would silently use the
    last): the name is unsafe as a whole, reason ``tar_member_duplicate``."""
    files: dict[str, tarfile.TarInfo] = {}
    unsafe: dict[str, UnsafeMember] = {}
    members, truncated = _read_members(tar)
    for member in members:
        if member.isdir() and member_name_problem(member.name) is None:
            continue  # directories carry no audio and are never created
        problem = audit_member(member)
        key = member_key(member.name) if problem is None or problem.reason != "tar_member_unsafe_path" else member.name
        if problem is None and key in files:
            problem = UnsafeMember(
                member.name, "tar_member_duplicate", f"{member.name!r} appears more than once: ambiguous"
            )
        if problem is None:
            files[key] = member
        else:
            unsafe[key] = problem
    if truncated is not None:
        key = member_key(truncated.name)
        files.pop(key, None)
        unsafe[key] = UnsafeMember(
            truncated.name, "tar_member_truncated", f"{truncated.name!r}: the tar ends inside it"
        )
    for key in unsafe.keys() & files.keys():
        del files[key]
    return TarAudit(files, unsafe)


def _read_members(tar: tarfile.TarFile) -> tuple[list[tarfile.TarInfo], tarfile.TarInfo | None]:
    """Every member header; a tar cut short keeps the members before the cut (and names the cut one)."""
    members: list[tarfile.TarInfo] = []
    try:
        while (member := tar.next()) is not None:
            members.append(member)
    except tarfile.ReadError:
        # ``next`` raises when the previous member's data runs past the end of the file.
        tar._loaded = True  # what was read is all there is; never re-read the broken tail
        return members[:-1], members[-1] if members else None
    return members, None


def contained_path(root: str, relative: str) -> str:
    """``root/relative`` after checking it cannot leave ``root`` (belt and braces for output paths)."""
    if member_name_problem(relative) is not None:
        raise ValueError(f"refusing to write {relative!r}: {member_name_problem(relative)}")
    joined = posixpath.normpath(posixpath.join(root, relative))
    if not joined.startswith(root.rstrip("/") + "/"):
        raise ValueError(f"refusing to write {relative!r}: resolves outside {root!r}")
    return joined
