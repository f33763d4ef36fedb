"""The nearest valid choice to a mistyped value, for error messages.

Every refusal of a name suggests the choice nearest to what was typed,
the same way.

>>> did_you_mean("mirored", ("default", "mirrored"))
" Did you mean 'mirrored'?"
"""

from __future__ import annotations

import difflib


def _squash(text):
    return "".join(c for c in str(text).lower() if c.isalnum())


def closest(value, choices, n=1, cutoff=0.6):
    """Up to ``n`` of ``choices`` nearest to ``value``, best first, ignoring
    case and separators.

    >>> closest("mirored", ("default", "mirrored", "tpu"))
    ['mirrored']
    >>> closest("VIT_B/16", ("ViT-B/16", "ViT-B/32"))
    ['ViT-B/16']
    >>> closest("zzz", ("token", "gap"))
    []
    """
    by_squash = {}
    for choice in choices:
        by_squash.setdefault(_squash(choice), choice)
    key = _squash(value)
    if key in by_squash:
        exact = [by_squash[key]]
        if n == 1:
            return exact
    else:
        exact = []
    near = difflib.get_close_matches(key, list(by_squash), n=n, cutoff=cutoff)
    found = exact + [by_squash[k] for k in near if by_squash[k] not in exact]
    return found[:n]


def did_you_mean(value, choices):
    """`` Did you mean 'x'?`` for the nearest choice, or ``""``."""
    near = closest(value, [str(c) for c in choices])
    return f" Did you mean {near[0]!r}?" if near else ""
