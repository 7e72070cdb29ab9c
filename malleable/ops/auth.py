"""Who may change what the daemon does: root, or a member of the operator group.

Commands that change settings (``pause``, ``resume``, ``policy set``) call
`require_operator` first. Root (effective uid 0) always may. Anyone else may
when ``[operator] group`` names a Unix group this process is a member of
(its effective or a supplementary group: membership granted after login
counts from the next login). Everyone else gets `Refused` (exit 1) with a
message saying who may and how to get there. The database's file permissions
apply on top of this (docs/operator-guide.md, "Who may do what").
"""

from __future__ import annotations

import grp
import os
import pwd
import re

from malleable.config import DEFAULT_CONFIG_PATH, ENV_CONFIG, Config
from malleable.ops.output import Refused


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_names(gids: list[int]) -> list[str]:
    out = []
    for g in gids:
        try:
            out.append(grp.getgrgid(g).gr_name)
        except KeyError:
            out.append(str(g))
    return out


def caller() -> str:
    """This process's user for messages: "alice (uid 1000, groups: alice, users)", and as
    root under sudo also who ran sudo: "root (uid 0, sudo by bob, groups: root)"."""
    uid = os.geteuid()
    name = _user_name(uid)
    gids = sorted(set([os.getegid(), *os.getgroups()]))
    sudo = _sudo_user(uid, name)
    return (f"{name} (uid {uid}" + (f", sudo by {sudo}" if sudo else "")
            + f", groups: {', '.join(_group_names(gids))})")


_USER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}\$?$")


def actor() -> str:
    """This process's user as the store records who changed a setting: "alice (uid 1000)",
    and as root under sudo also who ran sudo: "root (uid 0, sudo by bob)". ``$SUDO_USER``
    counts only for root with ``$SUDO_UID`` set (sudo sets both) and a valid user name:
    another user could write any name there (or a line break, to forge log lines)."""
    uid = os.geteuid()
    name = _user_name(uid)
    sudo = _sudo_user(uid, name)
    return f"{name} (uid {uid}" + (f", sudo by {sudo}" if sudo else "") + ")"


def _sudo_user(uid: int, name: str) -> str:
    """Who ran sudo, from ``$SUDO_USER``, or "" (not root, not under sudo, or not trusted)."""
    sudo = os.environ.get("SUDO_USER", "")
    if uid == 0 and os.environ.get("SUDO_UID", "").isdigit() and _USER_NAME.match(sudo) \
            and sudo != name:
        return sudo
    return ""


def is_operator(config: Config) -> bool:
    """True for root and for members of ``[operator] group`` (an unknown group: False)."""
    if os.geteuid() == 0:
        return True
    name = config.operator.group
    if not name:
        return False
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        return False
    return gid == os.getegid() or gid in os.getgroups()


def require_operator(config: Config, what: str) -> None:
    """Refuse unless the caller is root or in the operator group.

    Args:
        config: settings (``[operator] group``, and its source for the message).
        what: what the caller tried, for the message ("pause the daemon").

    Raises:
        Refused: the caller may not; the message names the caller, the rule and the fix.
    """
    if is_operator(config):
        return
    name = config.operator.group
    defaults = config.source == "<defaults>"       # no file read: name the file to write
    where = "[operator] group" if defaults else f"[operator] group in {config.source}"
    if not name:
        fix = (f"{where} in {DEFAULT_CONFIG_PATH} (or the file named by --config or "
               f"${ENV_CONFIG}; none was read)" if defaults else where)
        rule = (f"only root may {what}: no operator group is configured ({where} is empty); "
                f"run it with sudo, or have an administrator set {fix}")
    else:
        try:
            grp.getgrnam(name)
            rule = (f"only root or members of the operator group {name!r} ({where}) may {what}; "
                    f"run it with sudo, or ask to be added to {name!r} (then log in again)")
        except KeyError:
            rule = (f"only root or members of the operator group {name!r} ({where}) may {what}, "
                    f"and no group {name!r} exists on this host")
    raise Refused(f"permission denied: you are {caller()}; {rule}")
