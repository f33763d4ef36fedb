"""Where an export is built: a hidden directory next to the destination,
moved into place only when the artifact has passed.

Re-exported over an earlier SavedModel, an export replaces that
SavedModel's entries and keeps everything else in the folder; a symbolic
link is followed, and stays; the staging directory goes whichever way the
export ends (a watcher process removes it if this one is killed).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

from keras_vit.base import atomic
from keras_vit.export.common import ExportError

# What a re-export over a SavedModel directory replaces.
SAVED_MODEL_MAIN = "saved_model.pb"
SAVED_MODEL_ENTRIES = (SAVED_MODEL_MAIN, "saved_model.pbtxt", "variables",
                       "assets", "fingerprint.pb", "keras_metadata.pb",
                       "export_report.json")

_OPEN = threading.local()


def current():
    """The innermost open :class:`Staging` of this thread, or None."""
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

    :meth:`commit_files` / :meth:`commit_dir` move the verified files
    into place, the main artifact last. Leaving the ``with`` block without
    a commit removes the staging directory and the parent folders created.

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
        # The artifact's side files must sit beside the link's target.
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
        first (then the ``stale`` files), so that no finished-looking
        artifact pairs with another export's data files.
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
        """Moves the staged directory ``name`` to the destination; into an
        existing SavedModel, entry by entry (``saved_model.pb`` out first,
        in last)."""
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
