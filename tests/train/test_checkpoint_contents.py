"""A run checkpoint's contents decide, never its name: a run folder whose
checkpoints were renamed, copied, truncated, padded or joined by files of
another run resumes exactly where the uninterrupted run was at the step
the file records, or stops with one line naming the file; and nothing the
user put in the folder is ever deleted by the resumed run's pruning."""

import os
import shutil

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from keras_vit.base.errors import KerasVitError
from keras_vit.train import callbacks, checkpoints

STEPS = 6  # the uninterrupted run
STOPPED = 5  # where the interrupted one stopped (ckpt-3, -4, -5 kept)
KEEP = 3


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _state(model):
    """Every number a resumed run must get back: the weights and every
    optimizer variable (iteration count and momenta included)."""
    return [np.array(keras.ops.convert_to_numpy(v))
            for v in list(model.variables) + list(model.optimizer.variables)]


def _fit(model, start, end, cbs):
    x = np.linspace(-1, 1, STEPS * 6, dtype="float32").reshape(STEPS * 2, 3)
    y = np.stack([np.sin(3 * x[:, 0]), x[:, 1] * x[:, 2]], axis=1)
    model.fit(x[2 * start:2 * end], y[2 * start:2 * end], batch_size=2,
              epochs=1, verbose=0, callbacks=cbs, shuffle=False)


class _Trajectory(keras.callbacks.Callback):
    def __init__(self, model):
        super().__init__()
        self.states = [_state(model)]

    def on_train_batch_end(self, batch, logs=None):
        self.states.append(_state(self.model))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run's state after each step; the folder of the
    same run stopped at STOPPED; the folder of another run (other initial
    weights) stopped at STEPS."""
    model = _model()
    trajectory = _Trajectory(model)
    _fit(model, 0, STEPS, [trajectory])
    folders = {}
    for name, seed, end in (("run", 0, STOPPED), ("other", 1, STEPS)):
        folder = tmp_path_factory.mktemp(name)
        _fit(_model(seed), 0, end,
             [callbacks.StepCheckpoints(folder, every=1, keep=KEEP)])
        folders[name] = folder
    return trajectory.states, folders["run"], folders["other"]


def _assert_state(model, want, what):
    for got, expected in zip(_state(model), want, strict=True):
        np.testing.assert_array_equal(got, expected, err_msg=what)


def test_a_stopped_run_resumes_at_the_uninterrupted_state(runs, tmp_path):
    states, folder, _ = runs
    folder = shutil.copytree(folder, tmp_path / "run")
    assert checkpoints.steps(str(folder)) == [3, 4, 5]
    model = _model(seed=7)
    saver = callbacks.StepCheckpoints(folder, every=1, keep=KEEP)
    assert saver.restore(model) == STOPPED
    _assert_state(model, states[STOPPED], "restored")
    _fit(model, STOPPED, STEPS, [saver])
    _assert_state(model, states[STEPS], "continued")
    assert checkpoints.steps(str(folder)) == [4, 5, 6]


# -- hostile edits ----------------------------------------------------------

# Names a user might give a file: the run's own (canonical) names, and
# names the run never writes.
TARGETS = st.one_of(st.integers(0, 9).map(lambda s: f"ckpt-{s}.npz"),
                    st.sampled_from(["ckpt-0007.npz", "ckpt-05.npz",
                                     "ckpt-4.npz.bak", "backup.npz",
                                     "ckpt-999.npz"]))
SOURCES = st.sampled_from([3, 4, 5])
EDITS = st.one_of(
    st.tuples(st.just("rename"), SOURCES, TARGETS),
    st.tuples(st.just("copy"), SOURCES, TARGETS),
    st.tuples(st.just("truncate"), SOURCES, st.floats(0, 0.99)),
    st.tuples(st.just("pad"), SOURCES, st.integers(1, 5000)),
    st.tuples(st.just("foreign"), st.sampled_from([4, 5, 6]), TARGETS),
    st.tuples(st.just("junk"), st.binary(max_size=64), TARGETS))


def _apply(folder, other, edit, placed):
    """Applies ``edit`` to the run folder; ``placed`` (name -> bytes)
    collects the files the user put there under a new name."""
    kind, source, target = edit
    if kind in ("rename", "copy", "truncate", "pad"):
        src = folder / f"ckpt-{source}.npz"
        if not src.exists():
            return
        data = src.read_bytes()
    if kind in ("rename", "copy"):
        if target == src.name:
            return
        (folder / target).write_bytes(data)
        placed[target] = data
        if kind == "rename":
            src.unlink()
            placed.pop(src.name, None)
    elif kind == "truncate":
        src.write_bytes(data[:int(len(data) * target)])
        placed.pop(src.name, None)
    elif kind == "pad":
        src.write_bytes(data + b"\0" * target)
        placed.pop(src.name, None)
    else:
        data = (source if kind == "junk"
                else (other / f"ckpt-{source}.npz").read_bytes())
        (folder / target).write_bytes(data)
        placed[target] = data


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.function_scoped_fixture])
@given(edits=st.lists(EDITS, min_size=1, max_size=3))
def test_resume_after_hostile_edits_is_exact_or_one_line(runs, edits,
                                                         tmp_path_factory):
    states, base, other = runs
    folder = tmp_path_factory.mktemp("edited") / "run"
    shutil.copytree(base, folder)
    placed = {}
    for edit in edits:
        _apply(folder, other, edit, placed)
    model = _model(seed=7)
    saver = callbacks.StepCheckpoints(folder, every=1, keep=KEEP)
    newest = checkpoints.steps(str(folder))[-1:]
    try:
        step = saver.restore(model)
    except KerasVitError as e:
        assert isinstance(e, ValueError)
        text = str(e)
        assert "\n" not in text, text
        assert str(folder / f"ckpt-{newest[0]}.npz") in text, text
        step = None
    if step is not None:
        # The newest name, its own step: the uninterrupted run's state.
        assert [step] == newest
        _assert_state(model, states[step], f"restored at step {step}")
        if step < STEPS:
            _fit(model, step, STEPS, [saver])
            _assert_state(model, states[STEPS], "continued")
    # Nothing the user placed was deleted or changed.
    for name, data in placed.items():
        assert (folder / name).read_bytes() == data, name


def test_a_renamed_copy_names_the_file_and_both_steps(runs, tmp_path):
    _, base, _ = runs
    folder = shutil.copytree(base, tmp_path / "run")
    shutil.copy(folder / "ckpt-3.npz", folder / "ckpt-999.npz")
    with pytest.raises(ValueError, match=r"ckpt-999.npz' records step 3 but "
                       r"its name says step 999"):
        callbacks.StepCheckpoints(folder, every=1).restore(_model())


def test_a_file_of_another_run_is_refused_naming_both_runs(runs, tmp_path):
    _, base, other = runs
    folder = shutil.copytree(base, tmp_path / "run")
    shutil.copy(other / "ckpt-6.npz", folder / "ckpt-6.npz")
    ours = checkpoints.read_manifest(str(folder))["run"]
    theirs = checkpoints.read_manifest(str(other))["run"]
    with pytest.raises(ValueError, match=f"written by run {theirs}, not by "
                       f"this folder's run {ours}"):
        callbacks.StepCheckpoints(folder, every=1).restore(_model())


def test_a_name_the_run_never_writes_is_never_pruned(runs, tmp_path):
    """The reported case: ``ckpt-0007.npz`` made pruning delete each new
    checkpoint and the next save stop with a raw FileNotFoundError."""
    states, base, _ = runs
    folder = tmp_path / "fresh"
    foreign = (base / "ckpt-3.npz").read_bytes()
    folder.mkdir()
    (folder / "ckpt-0007.npz").write_bytes(foreign)
    model = _model()
    saver = callbacks.StepCheckpoints(folder, every=1, keep=KEEP)
    assert saver.restore(model) is None
    _fit(model, 0, STEPS, [saver])
    assert checkpoints.steps(str(folder)) == [4, 5, 6]
    assert (folder / "ckpt-0007.npz").read_bytes() == foreign
    again = _model(seed=7)
    assert callbacks.StepCheckpoints(folder, every=1).restore(again) == 6
    _assert_state(again, states[STEPS], "restored")


def test_a_folder_without_its_manifest_is_adopted_not_pruned(runs, tmp_path):
    """A run folder copied without its manifest resumes (the file's run
    becomes the folder's); the files it did not write stay."""
    states, base, _ = runs
    folder = shutil.copytree(base, tmp_path / "run")
    os.remove(folder / checkpoints.MANIFEST)
    model = _model(seed=7)
    saver = callbacks.StepCheckpoints(folder, every=1, keep=1)
    assert saver.restore(model) == STOPPED
    _fit(model, STOPPED, STEPS, [saver])
    _assert_state(model, states[STEPS], "continued")
    assert checkpoints.steps(str(folder)) == [3, 4, 5, 6]


def test_a_save_never_replaces_a_file_it_did_not_write(runs, tmp_path):
    _, base, other = runs
    folder = shutil.copytree(base, tmp_path / "run")
    model = _model()
    saver = callbacks.StepCheckpoints(folder, every=1)
    saver.restore(model)
    saver.set_model(model)
    shutil.copy(other / "ckpt-6.npz", folder / "ckpt-6.npz")
    with pytest.raises(ValueError, match=r"ckpt-6.npz' exists and was not "
                       "written by this run"):
        saver.save(6)
    assert (folder / "ckpt-6.npz").read_bytes() == (
        other / "ckpt-6.npz").read_bytes()


def test_a_restart_deletes_only_what_runs_wrote(runs, tmp_path):
    _, base, _ = runs
    folder = shutil.copytree(base, tmp_path / "run")
    (folder / "notes.txt").write_text("mine")
    shutil.copy(folder / "ckpt-3.npz", folder / "ckpt-0003.npz")
    shutil.copy(folder / "ckpt-3.npz", folder / "ckpt-8.npz")
    checkpoints.clear(str(folder))
    assert sorted(os.listdir(folder)) == ["ckpt-0003.npz", "ckpt-8.npz",
                                          "notes.txt"]
