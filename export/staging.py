"""Where an export is built: a hidden directory next to the destination,
moved into place only when the artifact has passed."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

from keras_vit.export.common import ExportError


class Staging:
    """A hidden directory next to the destination where an export is built.

    Everything is written and verified here first; :meth:`commit_files` /
    :meth:`commit_dir` then move it into place with ``os.replace``, the
    main artifact last. Leaving the
    ``with`` block without a commit (an error, Ctrl-C) removes the
    directory, so a failed export leaves nothing that looks finished; a
    killed process leaves only the hidden ``.NAME.partial-*`` directory.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> dest = os.path.join(folder, "m.onnx")
    >>> with Staging(dest) as stage:
    ...     _ = open(stage.file("m.onnx"), "w").write("verified")
    ...     stage.commit_files([("m.onnx", dest)])
    >>> os.listdir(folder)
    ['m.onnx']
    """

    def __init__(self, dest, directory=False, overwrite=True):
        self.dest = dest
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent):
            what = "is not a directory" if os.path.exists(parent) else (
                "does not exist")
            raise ExportError(f"cannot write {dest!r}: the directory "
                              f"{parent!r} {what}")
        if os.path.lexists(dest):
            if not overwrite:
                raise ExportError(f"{dest!r} exists; pass overwrite=True to "
                                  "replace it")
            if os.path.isdir(dest) != directory:
                kind = "directory" if os.path.isdir(dest) else "file"
                raise ExportError(f"{dest!r} is a {kind}; this export cannot "
                                  "replace it")
            if directory and os.listdir(dest) and not os.path.exists(
                    os.path.join(dest, "saved_model.pb")):
                # Replacing a directory deletes it: only ever an old export.
                raise ExportError(
                    f"{dest!r} is a directory that is not empty and holds "
                    "no SavedModel; refusing to replace it")
        try:
            self.path = tempfile.mkdtemp(
                prefix=f".{os.path.basename(dest)}.partial-", dir=parent)
        except OSError as e:
            raise ExportError(f"cannot write to the directory of {dest!r}: "
                              f"{e.strerror or e}") from e
        self.committed = False

    def file(self, name):
        return os.path.join(self.path, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)
        return False

    def commit_files(self, moves, stale=()):
        """Moves ``[(staged_name, final_path), ...]`` into place in order.

        The last entry is the artifact: an old one at that path is removed
        first (then the ``stale`` files of the old export), so that between
        the moves no finished-looking artifact pairs with data files from
        another export.
        """
        main = moves[-1][1]
        for old in [main] + list(stale):
            if os.path.lexists(old):
                os.remove(old)
        for name, final in moves:
            os.replace(self.file(name), final)
        self.committed = True

    def commit_dir(self, name):
        """Moves the staged directory ``name`` to the destination, swapping
        out an existing one."""
        old = None
        if os.path.lexists(self.dest):
            old = f"{self.path}.old-{uuid.uuid4().hex[:8]}"
            os.replace(self.dest, old)
        os.replace(self.file(name), self.dest)
        self.committed = True
        if old:
            shutil.rmtree(old, ignore_errors=True)
