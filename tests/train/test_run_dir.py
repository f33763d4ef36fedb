"""A run directory's own files as a hostile hand or a killed process leaves
them: ``history.jsonl`` and ``run.json`` are read through one schema each,
so a row or record of the wrong shape is refused naming the file, the line
or field and the value, and a killed process's cut-off last row is
skipped."""

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit import QUICK, tiny as _tiny
from testkit import one_error_line as _one_error_line
import keras_vit
from keras_vit.base.errors import ConfigError
from keras_vit.train import run_dir

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=5), inner, max_size=3), max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(value=JSON)
def test_a_history_line_is_a_row_or_refused_naming_the_line(value, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    path = run_dir.history_path(str(out))
    with open(path, "w") as f:
        f.write('{"step": 1, "loss": 0.5}\n' + json.dumps(value) + "\n")
    try:
        rows = run_dir.read_history(str(out))
    except ConfigError as e:
        assert f"{path} line 2" in str(e) and "\n" not in str(e)
        return
    assert rows[0] == {"step": 1, "loss": 0.5}
    assert isinstance(rows[1], dict) and isinstance(rows[1]["step"], int)
    assert rows[1]["step"] >= 0 and not isinstance(rows[1]["step"], bool)


def test_only_a_cut_off_last_line_is_skipped(tmp_path):
    path = run_dir.history_path(str(tmp_path))
    with open(path, "w") as f:
        f.write('{"step": 1}\n{"step": 2, "lo')  # killed mid-append
    assert run_dir.read_history(str(tmp_path)) == [{"step": 1}]
    with open(path, "w") as f:
        f.write('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ConfigError, match="line 2 is not valid JSON"):
        run_dir.read_history(str(tmp_path))
    with open(path, "w") as f:
        f.write('{"step": 1}\n[1, 2]\n')
    with pytest.raises(ConfigError, match=r"line 2 is a JSON list"):
        run_dir.read_history(str(tmp_path))
    # Truncating on resume reads the same way.
    with pytest.raises(ConfigError, match="line 2"):
        run_dir.truncate_history(str(tmp_path), 1)


@pytest.mark.parametrize("record, field", [
    ([1, 2], None),
    ({"label_names": 5}, "label_names"),
    ({"label_names": ["cat", 3]}, r"label_names\[1\]"),
    ({"recipe": [1]}, "recipe"),
    ({"total_steps": "many"}, "total_steps"),
    ({"image_size": [32, 32, 3]}, "image_size"),
    ({"num_classes": True}, "num_classes"),
])
def test_a_run_record_of_the_wrong_shape_is_refused(tmp_path, record, field):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError) as info:
        run_dir.read_run_record(str(path))
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message
    if field:
        assert f"field {field.replace(chr(92), '')}" in message
    # The record a checkpoint keeps is read by the same rules.
    with pytest.raises(ConfigError):
        run_dir.read_run_record("the checkpoint", json.dumps(record))


def test_resume_refuses_a_record_it_cannot_read(tmp_path):
    (tmp_path / "run.json").write_text('{"recipe": {}, "recipe": {}}')
    with pytest.raises(ConfigError, match="recipe"):
        run_dir.check_resume(str(tmp_path), {}, recorded=None,
                             resumed_from=3, resume=True, say=print)


# A resumed run with other settings is refused listing the differences.
@pytest.mark.slow
def test_resumed_run_with_other_settings_is_refused(tmp_path, capsys):
    from keras_vit.cli import train as train_cli

    out = tmp_path / "run"
    kw = dict(recipe="pretrain", out_dir=out, total_steps=2, warmup_steps=1,
              learning_rate=1e-3, **QUICK)
    keras_vit.train.Trainer(_tiny(), "digits", **kw).fit(stop_at_step=1)
    with pytest.raises(ValueError) as info:
        keras_vit.train.Trainer(_tiny(), "digits:test", **dict(
            kw, learning_rate=3e-3, seed=4))
    message = str(info.value)
    for change in ("recipe.learning_rate: 0.001 -> 0.003",
                   "recipe.seed: 0 -> 4",
                   "train_data: 'digits:train' -> 'digits:test'"):
        assert change in message
    assert "--resume-anyway" in message
    # The checkpoint itself records the settings: neither deleting run.json
    # nor editing it to the new settings lets them through.
    run_json = out / "run.json"
    saved = run_json.read_text()
    run_json.unlink()
    with pytest.raises(ValueError, match=r"recipe\.learning_rate: 0\.001 -> "
                                         r"0\.003; recipe\.seed: 0 -> 4"):
        keras_vit.train.Trainer(_tiny(), "digits", **dict(
            kw, learning_rate=3e-3, seed=4))
    edited = json.loads(saved)
    edited["recipe"].update(learning_rate=3e-3, seed=4)
    run_json.write_text(json.dumps(edited))
    with pytest.raises(ValueError, match=r"recipe\.learning_rate: 0\.001 -> "
                                         r"0\.003"):
        keras_vit.train.Trainer(_tiny(), "digits", **dict(
            kw, learning_rate=3e-3, seed=4))
    run_json.write_text(saved)
    run = keras_vit.train.Trainer(_tiny(), "digits", resume="force", **dict(
        kw, learning_rate=3e-3))
    assert run.resumed_from == 1
    # The CLI refuses in one line.
    status = train_cli.main([
        "fine-tune", str(tmp_path / "m.keras"), "--data", "digits",
        "--restart", "--resume-anyway", "--out", str(out)])
    assert status == 2
    assert "exclude each other" in capsys.readouterr().err


# A run folder belongs to one process: its lock names the holder.
_LOCK_HOLDER = r"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("atomic", sys.argv[2])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
lock = atomic.FileLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_a_run_folder_belongs_to_one_process(tmp_path, capsys):
    import gc
    import os
    import subprocess
    import sys

    from keras_vit.base import atomic
    from keras_vit.cli import train as train_cli
    from keras_vit.train.run_dir import RUN_LOCK, lock_run_dir

    out = tmp_path / "run"
    out.mkdir()
    lock = out / RUN_LOCK
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(lock), atomic.__file__],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        start = time.monotonic()
        assert train_cli.main(["fine-tune", "ViT-Ti/16", "--data", "digits",
                               "--out", str(out)]) == 2
        line = _one_error_line(capsys)
        assert f"is in use by pid {holder.pid} since" in line
        assert f"delete {lock}" in line
        assert time.monotonic() - start < 20  # before the model is built
    finally:
        holder.kill()
        holder.wait()
    # Its process is gone: the lock is taken over; one process may hold
    # it for several owners (a resumed Trainer), and it names this pid.
    class Owner:
        pass

    first, second = Owner(), Owner()
    lock_run_dir(first, out)
    lock_run_dir(second, out)
    assert lock.read_text().startswith(f"pid {os.getpid()} since")
    del first, second
    gc.collect()
    atomic.FileLock(lock).acquire().release()  # released with its owners
