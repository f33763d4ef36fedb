"""Where an export is built: a hidden directory next to the destination,
moved into place only when the artifact has passed.

An export owns only its own files. Re-exported over an earlier SavedModel,
it replaces that SavedModel's entries and keeps everything else in the
folder (TF Serving's ``assets.extra/tf_serving_warmup_requests``, notes);
a destination that is a symbolic link is followed, and the link stays; the
staging directory goes whichever way the export ends: finished, failed,
Ctrl-C, or the process killed (a watcher process removes it then).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

from keras_vit.base import atomic
from keras_vit.export.common import ExportError

# What a SavedModel directory holds (TensorFlow's writers and this
# package's report): a re-export replaces these and nothing else.
SAVED_MODEL_MAIN = "saved_model.pb"
SAVED_MODEL_ENTRIES = (SAVED_MODEL_MAIN, "saved_model.pbtxt", "variables",
                       "assets", "fingerprint.pb", "keras_metadata.pb",
                       "export_report.json")

_OPEN = threading.local()


def current():
    """The innermost open :class:`Staging` of this thread, or None: a
    converter process started during an export is stopped with it."""
    stack = getattr(_OPEN, "stack", None)
    return stack[-1] if stack else None


def missing_folders(folder):
    """The folders to create, outermost first, for ``folder`` to exist; an
    :class:`ExportError` if an existing ancestor is not a directory."""
    missing = []
    while not os.path.isdir(folder):
        if os.path.lexists(folder):
            raise ExportError(
                f"cannot create the folder {folder!r}: a file of that name "
                "is in the way (it is not a directory); pass another path")
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing[::-1]


class Staging:
    """A hidden directory next to the destination where an export is built.

    Everything is written and verified here first; :meth:`commit_files` /
    :meth:`commit_dir` then move it into place with ``os.replace``, the
    main artifact last. Missing parent folders of the destination are
    created, and removed again if the export fails. Leaving the ``with``
    block without a commit (an error, Ctrl-C) removes the staging
    directory, so a failed export leaves nothing that looks finished.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> dest = os.path.join(folder, "deploy", "m.onnx")
    >>> with Staging(dest) as stage:
    ...     _ = open(stage.file("m.onnx"), "w").write("verified")
    ...     stage.commit_files([("m.onnx", stage.target)])
    >>> os.listdir(folder), os.listdir(os.path.join(folder, "deploy"))
    (['deploy'], ['m.onnx'])
    """

    def __init__(self, dest, directory=False, overwrite=True):
        self.dest = dest
        self.directory = directory
        # A symbolic link is followed: the artifact (and its report and
        # data files, which must sit beside it) replaces what the link
        # points at, and the link goes on pointing at it.
        self.target = os.path.realpath(dest) if os.path.islink(dest) else dest
        if self.target != dest and not os.path.isdir(
                os.path.dirname(self.target)):
            raise ExportError(
                f"cannot write {dest!r}: it is a symbolic link to "
                f"{self.target!r}, whose folder does not exist; create it "
                "or remove the link")
        target = self.target
        if os.path.lexists(target):
            if not overwrite:
                raise ExportError(f"{dest!r} exists; pass overwrite=True to "
                                  "replace it")
            if os.path.isdir(target) != directory:
                kind = "directory" if os.path.isdir(target) else "file"
                raise ExportError(f"{dest!r} is a {kind}; this export cannot "
                                  "replace it")
            if directory and os.listdir(target) and not os.path.exists(
                    os.path.join(target, SAVED_MODEL_MAIN)):
                # Its entries could be anybody's: only ever merge into an
                # earlier export.
                raise ExportError(
                    f"{dest!r} is a directory that is not empty and holds "
                    "no SavedModel; refusing to write into it (pass a new "
                    "or empty directory)")
        parent = os.path.dirname(target)
        self._created = missing_folders(parent)
        self.path = None
        try:
            for folder in self._created:
                os.mkdir(folder)
            self.path = tempfile.mkdtemp(
                prefix=f".{os.path.basename(target)}.partial-", dir=parent)
        except OSError as e:
            self._remove_created()
            raise ExportError(f"cannot write {dest!r}: "
                              f"{e.strerror or e}"
                              + (f" ({e.filename})" if e.filename else "")
                              ) from e
        self.watcher = atomic.ScratchWatcher(self.path)
        self.committed = False

    def file(self, name):
        return os.path.join(self.path, name)

    def __enter__(self):
        if not hasattr(_OPEN, "stack"):
            _OPEN.stack = []
        _OPEN.stack.append(self)
        return self

    def __exit__(self, *exc):
        _OPEN.stack.remove(self)
        self.watcher.close()  # removes the staging directory
        if not self.committed:
            self._remove_created()
        return False

    def _remove_created(self):
        """The parent folders this export created, innermost first, if
        they are still empty."""
        for folder in reversed(self._created):
            try:
                os.rmdir(folder)
            except OSError:
                break

    def commit_files(self, moves, stale=()):
        """Moves ``[(staged_name, final_path), ...]`` into place in order.

        The last entry is the artifact: an old one at that path is removed
        first (then the ``stale`` files of the old export), so that between
        the moves no finished-looking artifact pairs with data files from
        another export. Ctrl-C waits until the moves are done.
        """
        main = moves[-1][1]
        with atomic.interrupts_deferred():
            for old in [main] + list(stale):
                if os.path.lexists(old):
                    os.remove(old)
            for name, final in moves:
                os.replace(self.file(name), final)
            self.committed = True

    def commit_dir(self, name):
        """Moves the staged directory ``name`` to the destination. Into an
        existing SavedModel directory its entries are moved one by one:
        the old SavedModel's entries go (``saved_model.pb`` first), the
        new ones come in (``saved_model.pb`` last), anything else in the
        folder stays."""
        staged = self.file(name)
        with atomic.interrupts_deferred():
            if not os.path.lexists(self.target):
                os.replace(staged, self.target)
                self.committed = True
                return
            replaced = self.file(".replaced")
            os.mkdir(replaced)
            new = os.listdir(staged)
            old = [SAVED_MODEL_MAIN] + sorted(
                (set(SAVED_MODEL_ENTRIES) | set(new)) - {SAVED_MODEL_MAIN})
            for entry in old:
                if os.path.lexists(os.path.join(self.target, entry)):
                    os.replace(os.path.join(self.target, entry),
                               os.path.join(replaced, entry))
            for entry in sorted(new, key=lambda e: e == SAVED_MODEL_MAIN):
                os.replace(os.path.join(staged, entry),
                           os.path.join(self.target, entry))
            self.committed = True
        shutil.rmtree(replaced, ignore_errors=True)
