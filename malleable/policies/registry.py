"""The policies by name.

Adding a policy is one new module (a `Policy` subclass with ``name``,
``Params`` and ``decide``) and one line in `POLICIES`. Modules are imported
on first use. ``default`` is an alias (one line, `DEFAULT`) for the
project's recommended policy; see docs/policies.md for why it is the one.
"""

from __future__ import annotations

import importlib
from typing import Any

from malleable.policies.base import Policy

# name -> "module:Class". One line per policy.
POLICIES: dict[str, str] = {
    "static": "malleable.policies.static:StaticPolicy",
    "fifo": "malleable.policies.fifo:FifoPolicy",
    "equi": "malleable.policies.equi:EquiPolicy",
    "las": "malleable.policies.las:LasPolicy",
    "srpt": "malleable.policies.srpt:SrptPolicy",
    "hesrpt": "malleable.policies.hesrpt:HesrptPolicy",
    "optimus": "malleable.policies.optimus:OptimusPolicy",
    "pollux": "malleable.policies.pollux:PolluxPolicy",
    "gittins": "malleable.policies.gittins:GittinsPolicy",
}

# The recommended policy: docs/policies.md ("The default") and
# benchmarks/results/policies_quality.txt say why. Changing the default is this one line.
DEFAULT = "pollux"


def available() -> list[str]:
    """All policy names, ``default`` included, sorted."""
    return sorted([*POLICIES, "default"])


def policy_class(name: str) -> type[Policy]:
    """The class registered under ``name`` (``default`` resolves to `DEFAULT`).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    target = DEFAULT if name == "default" else name
    if target not in POLICIES:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(available())})"
                         f"{did_you_mean(name)}")
    module_name, attr = POLICIES[target].split(":")
    return getattr(importlib.import_module(module_name), attr)


def did_you_mean(name: str) -> str:
    """``"; did you mean 'las'?"`` for a name that differs from a known one only in
    case or by a typo (difflib's closest match), else ``""``."""
    import difflib

    names = available()
    if isinstance(name, str) and name.lower() in names:
        return f"; did you mean {name.lower()!r}? Names are lower case"
    close = difflib.get_close_matches(str(name).lower(), names, n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


def get_policy(name: str, **params: Any) -> Policy:
    """A policy instance by name with its parameters.

    Args:
        name: one of `available()`.
        **params: the policy's parameters (fields of its ``Params``).

    Raises:
        ValueError: an unknown policy, an unknown parameter, a parameter of
            the wrong type or out of range (the message names it and its value).
    """
    return policy_class(name)(**params)
