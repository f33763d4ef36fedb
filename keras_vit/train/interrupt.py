"""Ctrl-C during training: stop after the current step with a checkpoint
of it, not up to ``checkpoint_every`` steps back.

The first Ctrl-C asks the loop to stop once the step under way is done,
save it and raise :class:`TrainingInterrupted`. A second Ctrl-C exits the
process at once (status 130) without saving.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C, after saving a checkpoint of ``step``
    (of ``total_steps``) in ``out_dir``; the same call (or command)
    resumes from it."""

    def __init__(self, step, total_steps, out_dir):
        self.step, self.total_steps, self.out_dir = step, total_steps, out_dir
        super().__init__(
            f"training interrupted at step {step} of {total_steps}; "
            f"checkpoint saved in {out_dir}: the same Trainer(..., "
            "out_dir=...).fit() resumes from it")


class StopOnInterrupt:
    """While open (in the main thread, ``enabled``): Ctrl-C sets
    :attr:`requested` instead of raising, and says so; a second Ctrl-C
    exits the process at once."""

    def __init__(self, enabled=True, say=None):
        self.enabled = enabled and (
            threading.current_thread() is threading.main_thread())
        self.requested = False
        self._say = say or (lambda text: print(text, file=sys.stderr,
                                               flush=True))
        self._previous = None
        self._installed = False

    def _handle(self, signum, frame):
        if self.requested:
            self._say("interrupted again: exiting now, without saving; the "
                      "last checkpoint on disk resumes")
            os._exit(130)
        self.requested = True
        self._say("\ninterrupted: saving a checkpoint after this step "
                  "(Ctrl-C again to exit at once)")

    def __enter__(self):
        if self.enabled:
            try:
                self._previous = signal.signal(signal.SIGINT, self._handle)
                self._installed = True
            except ValueError:  # not the main interpreter
                self.enabled = False
        return self

    def __exit__(self, *exc):
        # Once. None: the handler was not installed from Python; it cannot
        # be put back, so Python's own is.
        if self._installed:
            self._installed = False
            signal.signal(signal.SIGINT, self._previous
                          if self._previous is not None
                          else signal.default_int_handler)
        return False
