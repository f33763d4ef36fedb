"""The training guide's ``model.fit`` form of the DeiT recipe, run as
written (tiny): a Ctrl-C mid-run stops after the step under way with a
checkpoint of it, and running the same code again goes on from that
step to the end of the run."""

import re
import signal
from pathlib import Path

import keras
import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "training.md"
FIRST_LINE = "# DeiT on the digits through model.fit; run it again to resume"


def guide_block():
    for code in re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(),
                           re.M | re.S):
        if code.startswith(FIRST_LINE):
            return code
    raise AssertionError(f"no block of {GUIDE.name} starts {FIRST_LINE!r}")


class CtrlCAt(keras.callbacks.Callback):
    """Sends this process SIGINT (a Ctrl-C) at the end of batch ``at``."""

    def __init__(self, at):
        super().__init__()
        self.at, self.batches = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches == self.at:
            signal.raise_signal(signal.SIGINT)


def run_block(code, ctrl_c_at=None):
    for old, new in (("total_steps=120,", "total_steps=6,"),
                     ("every=20", "every=4")):
        assert old in code, old
        code = code.replace(old, new)
    if ctrl_c_at is not None:
        old = "callbacks=[stop, saver]"
        assert old in code
        code = code.replace(old, f"callbacks=[CtrlCAt({ctrl_c_at}), stop, "
                                 "saver]")
    namespace = {"CtrlCAt": CtrlCAt}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    return namespace


@pytest.mark.slow
def test_the_guides_deit_fit_stops_on_ctrl_c_and_resumes(tmp_path,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = guide_block()
    before = signal.getsignal(signal.SIGINT)
    with pytest.warns(UserWarning):   # the recipe's EMA fitted to 6 steps
        first = run_block(code, ctrl_c_at=3)
    # Stopped after step 3 (not at the checkpoint every 4), saved it.
    assert first["stop"].requested and first["stop"].step == 3
    assert signal.getsignal(signal.SIGINT) is before
    runs = tmp_path / "runs" / "deit-fit"
    assert (runs / "ckpt-3.npz").is_file()
    assert not (tmp_path / "deit-digits.keras").exists()

    second = run_block(code)
    assert second["start"] == 3
    model = second["model"]
    # The three steps left, counted on from the checkpoint.
    assert int(model.optimizer.iterations.numpy()) == 6
    assert not second["stop"].requested and second["stop"].step == 6
    assert (runs / "ckpt-6.npz").is_file()
    assert (tmp_path / "deit-digits.keras").is_file()
    assert signal.getsignal(signal.SIGINT) is before
