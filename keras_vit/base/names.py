"""Class names as people read them: one spelling per name, and messages
that show the difference when two names only look alike.

A name can reach the package in several Unicode spellings that print the
same (NFC, or NFD from a folder made on macOS). Every class name is kept
in NFC, so two names compare equal exactly when they read the same.

>>> import unicodedata
>>> nfd = unicodedata.normalize("NFD", "café")
>>> len(nfd), len(class_name(nfd)), class_name(nfd) == "café"
(5, 4, True)
>>> shown_apart("paypal", ["pаypal"])  # the second 'а' is Cyrillic
"'paypal' (p a y p a l)"
"""

from __future__ import annotations

import unicodedata


def class_name(name):
    """``name`` (a str) in its one kept spelling (Unicode NFC)."""
    return unicodedata.normalize("NFC", name)


def class_names(names):
    """:func:`class_name` of each of ``names`` (None stays None)."""
    return None if names is None else [class_name(n) for n in names]


def _code_points(name):
    return " ".join(c if c.isascii() and c.isprintable()
                    else f"U+{ord(c):04X}" for c in name)


def _looks(name):
    # What a reader sees: compatibility forms folded, case kept, and the
    # Latin letters that other scripts draw alike.
    folded = unicodedata.normalize("NFKC", name)
    return folded.translate(_CONFUSABLE)


# Cyrillic and Greek letters drawn like Latin ones (the common confusables).
_CONFUSABLE = str.maketrans(
    "аеорсухіјѕԁАВЕКМНОРСТХІЈЅΑΒΕΗΙΚΜΝΟΡΤΥΧον",
    "aeopcyxijsdABEKMHOPCTXIJSABEHIKMNOPTYXov")


def shown_apart(name, others):
    """``repr(name)``, followed by its code points when one of ``others``
    looks the same but is another name."""
    alike = any(o != name and _looks(o) == _looks(name) for o in others)
    return repr(name) + (f" ({_code_points(name)})" if alike else "")
