"""Read audio out of an untrusted tar without ever letting a member name choose where bytes go.

``tarfile.extractall`` trusts member names: ``../../etc/cron.d/x``, ``/abs/path``, a symlink
followed by a file written through it, or a device node all escape or damage the destination.
Here every member is audited first; only regular files with a plain relative name are readable, and
the caller chooses every output path itself (from a validated ``utt_id``). Each unsafe member comes
back with a stable reason code, so it can be reported and never silently skipped.

A member is also checked for its real size before a byte of it is read: a sparse member (a few
kilobytes stored, gigabytes of zeros when read), a member larger than :data:`MAX_TAR_MEMBER_BYTES`
and a member whose data runs past the end of the archive are refused with the size in the detail,
so no reader ever inflates one in memory.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
from dataclasses import dataclass

_DRIVE = re.compile(r"^[A-Za-z]:")

MAX_TAR_MEMBER_BYTES = 4 << 30
"""The largest member any reader opens: 4 GiB, about 6 hours of 48 kHz stereo 16-bit WAV. Larger is
``tar_member_too_large``: no landed recording needs more, and readers copy members as streams anyway."""


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


def audit_member(
    member: tarfile.TarInfo, archive_bytes: int | None = None, max_member_bytes: int = MAX_TAR_MEMBER_BYTES
) -> UnsafeMember | None:
    """None for a regular file with a safe name and a real size; otherwise the reason it must not be read.

    ``archive_bytes``: the archive's length where known (a seekable file), so a member claiming more
    data than the archive holds is refused from its header."""
    problem = member_name_problem(member.name)
    if problem is not None:
        return UnsafeMember(member.name, "tar_member_unsafe_path", f"{member.name!r}: {problem}")
    if member.issym() or member.islnk():
        return UnsafeMember(member.name, "tar_member_is_link", f"{member.name!r} links to {member.linkname!r}")
    if member.ischr() or member.isblk() or member.isfifo():
        return UnsafeMember(member.name, "tar_member_is_device", f"{member.name!r} is a device or FIFO")
    if not member.isreg():
        return UnsafeMember(member.name, "tar_member_not_a_file", f"{member.name!r} has tar type {member.type!r}")
    return member_size_problem(member, archive_bytes, max_member_bytes)


def member_size_problem(
    member: tarfile.TarInfo, archive_bytes: int | None = None, max_member_bytes: int = MAX_TAR_MEMBER_BYTES
) -> UnsafeMember | None:
    """Why reading ``member`` would give more bytes than it really stores or than any reader may hold."""
    if member.sparse is not None:
        stored = sum(length for _, length in member.sparse)
        return UnsafeMember(
            member.name,
            "tar_member_sparse",
            f"{member.name!r} is a sparse member: {member.size} bytes when read, {stored} stored",
        )
    if member.size > max_member_bytes:
        return UnsafeMember(
            member.name,
            "tar_member_too_large",
            f"{member.name!r} is {member.size} bytes, over the {max_member_bytes}-byte limit for one member",
        )
    if archive_bytes is not None and member.offset_data + member.size > archive_bytes:
        return UnsafeMember(
            member.name,
            "tar_member_truncated",
            f"{member.name!r}: the tar ends inside it ({member.size} bytes claimed, "
            f"{max(archive_bytes - member.offset_data, 0)} present)",
        )
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
    archive_bytes = _archive_bytes(tar)
    for member in members:
        if member.isdir() and member_name_problem(member.name) is None:
            continue  # directories carry no audio and are never created
        problem = audit_member(member, archive_bytes)
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
        sized = member_size_problem(truncated, archive_bytes)
        unsafe[key] = (
            sized
            if sized is not None and sized.reason == "tar_member_truncated"  # with the sizes where known
            else UnsafeMember(truncated.name, "tar_member_truncated", f"{truncated.name!r}: the tar ends inside it")
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


def _archive_bytes(tar: tarfile.TarFile) -> int | None:
    """The archive's length, or None where its file cannot seek (a stream)."""
    handle = tar.fileobj
    try:
        here = handle.tell()
        end = handle.seek(0, 2)
        handle.seek(here)
    except (AttributeError, OSError, ValueError):
        return None
    return int(end) if end is not None else None


def contained_path(root: str, relative: str) -> str:
    """``root/relative`` after checking it cannot leave ``root`` (belt and braces for output paths)."""
    if member_name_problem(relative) is not None:
        raise ValueError(f"refusing to write {relative!r}: {member_name_problem(relative)}")
    joined = posixpath.normpath(posixpath.join(root, relative))
    if not joined.startswith(root.rstrip("/") + "/"):
        raise ValueError(f"refusing to write {relative!r}: resolves outside {root!r}")
    return joined
