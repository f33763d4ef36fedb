"""keras_vit.train.vtab (the VTAB-1k runner and ``keras-vit vtab``) and the
head-dependent learning rates of the recipes (Appendix D.3).

The end-to-end runs read tfds' mock data (``tfds.testing.mock_data``): the
metadata of each dataset (its split sizes) is written to a temporary
data_dir, so the runner sees a prepared dataset whose examples are random.
Nothing goes online.
"""

import json
import time

import numpy as np
import pytest

import keras
import keras_vit
from keras_vit import cli
from keras_vit import train as kt
from keras_vit.train import recipes, vtab

import tensorflow_datasets as tfds

TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64, num_classes=10)
# Split sizes written as metadata; the mock yields MOCK_EXAMPLES per split.
SIZES = {"dtd": {"train": 40, "validation": 20, "test": 30},
         "eurosat/rgb": {"train": 100},
         "dsprites": {"train": 200}}
MOCK_EXAMPLES = 40
QUICK = dict(train_examples=24, val_examples=8, steps=4, batch_size=8,
             image_size=16, strategy="default", verbose=False)


def tiny(seed=1, **kwargs):
    keras.utils.set_random_seed(seed)
    return keras_vit.vit(**dict(TINY, **kwargs))


def _write_metadata(data_dir, name, sizes):
    """What a prepared dataset has on disk besides its records: enough
    for tfds (and the mock) to know the splits."""
    builder = tfds.builder(name, data_dir=str(data_dir))
    builder.info.set_splits(tfds.core.SplitDict([
        tfds.core.SplitInfo(name=split, shard_lengths=[n], num_bytes=0,
                            filename_template=None)
        for split, n in sizes.items()]))
    builder.data_path.mkdir(parents=True, exist_ok=True)
    builder.info.write_to_directory(builder.data_path)


@pytest.fixture()
def mock_vtab(tmp_path):
    data_dir = tmp_path / "tfds"
    for name, sizes in SIZES.items():
        _write_metadata(data_dir, name, sizes)
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES,
                                data_dir=str(data_dir)):
        yield str(data_dir)


# --------------------------------------------------------------------------
# head-dependent learning rates (recipes, Trainer, compile_for_finetune)


def test_recipe_learning_rate_follows_the_head():
    # Figure 9: class token at 8e-4, GAP at 3e-4 (JFT pre-training).
    assert recipes.get("pretrain-jft", classifier="token").learning_rate \
        == 8e-4
    assert recipes.get("pretrain-jft", classifier="gap").learning_rate == 3e-4
    # The other pre-trainings: the same ratio; no head: the recipe's own.
    assert recipes.get("pretrain", classifier="gap").learning_rate \
        == pytest.approx(1e-3 * 3 / 8)
    assert recipes.get("pretrain").learning_rate == 1e-3
    # Fine-tuning: one rate for both heads.
    assert recipes.get("finetune", classifier="gap").learning_rate == 0.01
    # An explicit rate wins; a Recipe object keeps its own.
    assert recipes.get("pretrain-jft", classifier="gap",
                       learning_rate=5e-4).learning_rate == 5e-4
    own = recipes.get("pretrain-jft", learning_rate=7e-4)
    assert recipes.get(own, classifier="gap").learning_rate == 7e-4
    with pytest.raises(ValueError, match="classifier='cls'"):
        recipes.get("pretrain", classifier="cls")


def test_trainer_gives_gap_and_token_models_their_own_default_lr():
    kw = dict(recipe="pretrain-jft", total_steps=5, warmup_steps=1,
              batch_size=16, strategy="default", verbose=False)
    token = kt.Trainer(tiny(classifier="token"), "digits", **kw)
    gap = kt.Trainer(tiny(classifier="gap"), "digits", **kw)
    assert token.recipe.learning_rate == 8e-4
    assert gap.recipe.learning_rate == 3e-4
    assert gap.optimizer._learning_rate.peak == 3e-4
    for model in (tiny(classifier="token"), tiny(classifier="gap")):
        explicit = kt.Trainer(model, "digits", learning_rate=2e-3, **kw)
        assert explicit.recipe.learning_rate == 2e-3
        assert explicit.optimizer._learning_rate.peak == 2e-3
    # model.fit through compile_for_finetune too.
    r = kt.compile_for_finetune(tiny(classifier="gap"), "pretrain-jft",
                                total_steps=5, warmup_steps=1)
    assert r.learning_rate == 3e-4


# --------------------------------------------------------------------------
# the task table, splits and labels


def test_the_19_tasks_of_table_9():
    assert len(vtab.TASKS) == 19
    assert {g: len(vtab.tasks_in(g)) for g in vtab.GROUPS} == {
        "Natural": 7, "Specialized": 4, "Structured": 8}
    tfds_names = {t.tfds_name for t in vtab.TASKS.values()}
    assert {"svhn_cropped", "sun397/tfds", "eurosat/rgb", "kitti",
            "diabetic_retinopathy_detection/btgraham-300"} <= tfds_names
    known = set(tfds.list_builders())
    assert {n.split("/")[0] for n in tfds_names} <= known
    # No crop or flip where they would change the label.
    assert all(not vtab.TASKS[n].augment for n in vtab.tasks_in("Structured"))
    assert all(vtab.TASKS[n].augment for n in vtab.tasks_in("Natural"))


@pytest.mark.parametrize("task, sizes, final, sweep", [
    # a 90% head of train for training, the rest for validation
    ("caltech101", {"train": 3060, "test": 6084},
     ("train[0:800]+train[2754:2954]", "test"),
     ("train[0:800]", "train[2754:2954]")),
    ("clevr_count", {"train": 70000, "validation": 15000, "test": 15000},
     ("train[0:800]+train[63000:63200]", "validation"),
     ("train[0:800]", "train[63000:63200]")),
    # three tfds splits
    ("dtd", {"train": 1880, "validation": 1880, "test": 1880},
     ("train[0:800]+validation[0:200]", "test"),
     ("train[0:800]", "validation[0:200]")),
    # one split cut 60/20/20 and 80/10/10
    ("resisc45", {"train": 31500},
     ("train[0:800]+train[18900:19100]", "train[25200:31500]"),
     ("train[0:800]", "train[18900:19100]")),
    ("dsprites_location", {"train": 737280},
     ("train[0:800]+train[589824:590024]", "train[663552:737280]"),
     ("train[0:800]", "train[589824:590024]")),
    # validation from the first half of test
    ("smallnorb_elevation", {"train": 24300, "test": 24300},
     ("train[0:800]+test[0:200]", "test[12150:24300]"),
     ("train[0:800]", "test[0:200]")),
])
def test_split_instructions_follow_task_adaptation(task, sizes, final, sweep):
    counts = {}
    got = vtab.split_instructions(task, sizes, _counts=counts)
    assert (got["train"], got["eval"]) == final
    assert counts["train"] == 1000
    got = vtab.split_instructions(task, sizes, sweep=True, _counts=counts)
    assert (got["train"], got["eval"]) == sweep
    assert counts == {"train": 800, "eval": 200}


def test_split_sizes_are_checked():
    with pytest.raises(kt.DataError, match="received train_examples=900"):
        vtab.split_instructions("dtd", {"train": 850, "validation": 300,
                                        "test": 10}, train_examples=900)
    with pytest.raises(kt.DataError, match="no split 'validation'"):
        vtab.split_instructions("dtd", {"train": 850, "test": 10})


def test_derived_labels_match_the_vtab_definitions():
    import tensorflow as tf

    def clevr(depths):
        coords = np.zeros((len(depths), 3), "float32")
        coords[:, 2] = depths
        return {"objects": {"pixel_coords": tf.constant(coords)}}

    count = vtab.label_fn("clevr_count")
    distance = vtab.label_fn("clevr_distance")
    assert int(count(clevr([9.0] * 3))) == 0      # 3 objects: class 0
    assert int(count(clevr([9.0] * 10))) == 7     # 10 objects: class 7
    # closest object's depth in bins 0-8, 8-8.5, ..., 10-100
    assert int(distance(clevr([7.9, 12.0]))) == 0
    assert int(distance(clevr([8.7, 9.9]))) == 2
    assert int(distance(clevr([11.0, 30.0]))) == 5

    def kitti(types, depths):
        loc = np.zeros((len(types), 3), "float32")
        loc[:, 2] = depths
        return {"objects": {"type": tf.constant(types, tf.int64),
                            "location": tf.constant(loc)}}

    kd = vtab.label_fn("kitti_distance")
    # cars/vans/trucks (0-2) only; pedestrians (3) do not count
    assert int(kd(kitti([3, 0], [2.0, 30.0]))) == 2
    assert int(kd(kitti([1, 2], [5.0, 15.0]))) == 0
    assert int(kd(kitti([0], [12.0]))) == 1
    assert int(kd(kitti([4, 5], [3.0, 4.0]))) == 3   # no vehicle
    features = tfds.builder("dsprites").info.features
    orient = vtab.label_fn("dsprites_orientation", features)
    loc = vtab.label_fn("dsprites_location", features)
    # 40 orientations and 32 x-positions regrouped into 16 classes each
    assert [int(orient({"label_orientation": tf.constant(v, tf.int64)}))
            for v in (0, 2, 3, 39)] == [0, 0, 1, 15]
    assert [int(loc({"label_x_position": tf.constant(v, tf.int64)}))
            for v in (0, 1, 2, 31)] == [0, 0, 1, 15]


def test_task_names_and_groups_resolve_with_hints():
    assert vtab.resolve_tasks(None) == list(vtab.TASKS)
    assert vtab.resolve_tasks("Clevr-Count,structured")[:2] == [
        "clevr_count", "clevr_distance"]
    assert len(vtab.resolve_tasks(["structured"])) == 8
    with pytest.raises(ValueError, match=r"Unknown VTAB task 'dtdd' in "
                                         r"tasks=\['dtdd'\].*'dtd'"):
        vtab.resolve_tasks(["dtdd"])


# --------------------------------------------------------------------------
# errors: missing data, bad input


def test_missing_data_fails_fast_with_how_to(tmp_path):
    data_dir = str(tmp_path / "empty")
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError) as info:
        vtab.run(tiny(), ["dtd", "diabetic_retinopathy"], data_dir=data_dir,
                 out_dir=str(tmp_path / "out"), verbose=False)
    assert time.perf_counter() - t0 < 30
    text = str(info.value)
    assert "2 of 2 task(s)" in text and data_dir in text
    assert ("`tfds build diabetic_retinopathy_detection/btgraham-300 dtd "
            f"--data_dir {data_dir}`") in text
    assert "manual download" in text and "kaggle" in text.lower()
    assert "--manual_dir" in text and "--download" in text
    assert not (tmp_path / "out").exists()  # nothing trained


def test_bad_arguments_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="steps must be a positive integer; "
                                         "received steps=0"):
        vtab.run(tiny(), ["dtd"], steps=0, verbose=False)
    with pytest.raises(ValueError, match="received train_examples=-5"):
        vtab.run(tiny(), ["dtd"], train_examples=-5, verbose=False)
    with pytest.raises(ValueError, match="Unknown VTAB task 'cifar1000'"):
        vtab.run(tiny(), ["cifar1000"], verbose=False)
    with pytest.raises(ValueError, match="unknown recipe field"):
        vtab.run(tiny(), ["dtd"], lr=0.1, verbose=False)


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["vtab", "x.keras", "--tasks", "dtd,svhm"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("keras-vit: error")]
    assert len(lines) == 1 and "Unknown VTAB task 'svhm'" in lines[0], err
    assert "'svhn'" in lines[0]
    assert cli.main(["vtab", "x.keras", "--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "--steps" in err and "got 0" in err
    assert cli.main(["vtab", "x.keras", "--steps", "many"]) == 2
    assert "'many'" in capsys.readouterr().err
    data_dir = str(tmp_path / "nothing")
    assert cli.main(["vtab", "x.keras", "--tasks", "svhn", "--data-dir",
                     data_dir]) == 2
    err = capsys.readouterr().err
    assert "`tfds build svhn_cropped --data_dir" in err
    # A file where the output folder would go: refused before any task.
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert cli.main(["vtab", "x.keras", "--tasks", "dtd", "--out",
                     str(afile / "sweep")]) == 2
    assert "afile' is a file, not a folder" in capsys.readouterr().err


# --------------------------------------------------------------------------
# end to end on tfds mock data


def _check_scores(scores, tasks, n_train, n_eval):
    assert list(scores["tasks"]) == tasks
    for name in tasks:
        r = scores["tasks"][name]
        assert r["group"] == vtab.TASKS[name].group
        assert 0.0 <= r["accuracy"] <= 1.0
        assert (r["num_train"], r["num_eval"]) == (n_train, n_eval)
        assert r["total_steps"] == 4 and r["image_size"] == 16
    groups = {vtab.TASKS[n].group for n in tasks}
    assert set(scores["groups"]) == groups
    for g in scores["groups"].values():
        accs = [scores["tasks"][n]["accuracy"] for n in g["tasks"]]
        assert g["mean"] == pytest.approx(np.mean(accs))
        assert g["complete"] is False
    assert scores["mean"] == pytest.approx(
        np.mean([r["accuracy"] for r in scores["tasks"].values()]))
    assert scores["complete"] is False


@pytest.mark.slow
def test_runner_end_to_end_on_mock_data(mock_vtab, tmp_path):
    out = tmp_path / "vtab"
    tasks = ["dtd", "eurosat", "dsprites_orientation"]
    scores = vtab.run(tiny(), tasks, data_dir=mock_vtab, out_dir=str(out),
                      test_examples=16, **QUICK)
    _check_scores(scores, tasks, n_train=24 + 8, n_eval=16)
    on_disk = json.loads((out / "vtab.json").read_text())
    _check_scores(on_disk, tasks, n_train=32, n_eval=16)
    assert on_disk["protocol"]["train_examples"] == 24
    t = on_disk["tasks"]
    assert t["dtd"]["train_split"] == "train[0:24]+validation[0:8]"
    assert t["eurosat"]["train_split"] == "train[0:24]+train[60:68]"
    assert t["eurosat"]["eval_split"] == "train[80:96]"
    assert t["dsprites_orientation"]["num_classes"] == 16
    assert t["dtd"]["num_classes"] == 47
    # Structured tasks are not cropped or flipped; the others are.
    assert (t["dsprites_orientation"]["crop_area"],
            t["dsprites_orientation"]["flip"]) == (None, False)
    assert t["dtd"]["flip"] is True and t["dtd"]["crop_area"][0] < 1.0
    table = (out / "vtab.md").read_text()
    for needle in ("DTD", "EuroSAT", "dSpr-Ori", "**Natural**",
                   "**Specialized**", "**Structured**", "**all**",
                   "(3 of 19 tasks)"):
        assert needle in table
    assert f"{100 * on_disk['mean']:.1f}" in table
    # Per task: a run directory with its own scores; checkpoints removed.
    assert (out / "dtd" / "vtab_task.json").is_file()
    assert not (out / "dtd" / "checkpoints").exists()
    # Running again reuses the finished tasks (same protocol).
    again = vtab.run(tiny(), tasks[:1], data_dir=mock_vtab,
                     out_dir=str(out), test_examples=16, **QUICK)
    assert again["tasks"]["dtd"] == scores["tasks"]["dtd"]


@pytest.mark.slow
def test_sweep_and_protocol_sizes_on_mock_data(mock_vtab, tmp_path):
    # train800 -> val200 with the protocol's own sizes (the metadata makes
    # them available), read through the mock.
    _write_metadata(mock_vtab, "smallnorb", {"train": 1000, "test": 600})
    with tfds.testing.mock_data(num_examples=1000, data_dir=mock_vtab):
        train, evaluation = vtab.load_task("smallnorb_azimuth",
                                           data_dir=mock_vtab, sweep=True)
        assert (train.split, evaluation.split) == ("train[0:800]",
                                                   "test[0:200]")
        assert (train.num_examples, evaluation.num_examples) == (800, 200)
        assert len(train.labels()) == 800 and train.num_classes == 18
        final, test = vtab.load_task("smallnorb_azimuth", data_dir=mock_vtab)
        assert final.num_examples == 1000 and test.num_examples == 300
        assert len(test.labels()) == 300
        scores = vtab.run(tiny(), ["smallnorb_azimuth"], data_dir=mock_vtab,
                          sweep=True, out_dir=str(tmp_path / "s"),
                          **dict(QUICK, train_examples=800,
                                 val_examples=200))
    r = scores["tasks"]["smallnorb_azimuth"]
    assert (r["num_train"], r["num_eval"]) == (800, 200)
    assert scores["protocol"]["mode"].startswith("sweep")
    assert (tmp_path / "s" / "vtab-sweep.json").is_file()


@pytest.mark.slow
def test_cli_vtab_on_mock_data(mock_vtab, tmp_path, capsys):
    model = tmp_path / "tiny.keras"
    tiny().save(model)
    out = tmp_path / "cli"
    assert cli.main(["vtab", str(model), "--tasks", "dtd,eurosat",
                     "--data-dir", mock_vtab, "--steps", "4",
                     "--batch-size", "8", "--image-size", "16",
                     "--train-examples", "24", "--val-examples", "8",
                     "--test-examples", "16", "--out", str(out),
                     "--strategy", "default", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "| Natural | DTD |" in printed and "**all**" in printed
    scores = json.loads((out / "vtab.json").read_text())
    _check_scores(scores, ["dtd", "eurosat"], n_train=32, n_eval=16)


# --------------------------------------------------------------------------
# every Keras backend (tests/conftest.py re-runs these on jax and torch)


def fixed_tiny():
    """The tiny model with the same weights on every backend: Keras' own
    initialisers draw from each backend's generator, NumPy does not."""
    model = keras_vit.vit(**TINY)
    rng = np.random.default_rng(0)
    model.set_weights([
        w if np.all(w == w.flat[0])  # ones and zeros (norms, biases)
        else rng.normal(0.0, 0.05, w.shape).astype(w.dtype)
        for w in model.get_weights()])
    return model


# The loss and accuracy of the run below, measured on TensorFlow: a
# Structured task (no random crop or flip), tf.data feeding every backend
# the same batches, so the jax and torch runs must land on the same
# numbers up to float32 rounding.
VTAB_ON_TF = {"loss": 2.7493749, "accuracy": 0.125}


@pytest.mark.slow
@pytest.mark.backends
def test_cli_vtab_on_this_backend_matches_tensorflow(mock_vtab, tmp_path,
                                                     capsys):
    model = tmp_path / "tiny.keras"
    fixed_tiny().save(model)
    assert cli.main(["vtab", str(model), "--tasks", "dsprites-orientation",
                     "--data-dir", mock_vtab, "--steps", "3",
                     "--batch-size", "8", "--image-size", "16",
                     "--train-examples", "16", "--val-examples", "8",
                     "--test-examples", "16", "--out", str(tmp_path / "v"),
                     "-q", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    r = scores["tasks"]["dsprites_orientation"]
    assert (r["num_train"], r["num_eval"], r["total_steps"]) == (24, 16, 3)
    assert r["loss"] == pytest.approx(VTAB_ON_TF["loss"], abs=2e-5)
    assert r["accuracy"] == pytest.approx(VTAB_ON_TF["accuracy"], abs=1e-9)
    assert (tmp_path / "v" / "vtab.json").is_file()


@pytest.mark.backends
def test_a_strategy_this_backend_cannot_run_fails_before_the_data(
        tmp_path, capsys):
    backend = keras.backend.backend()
    name = "mirrored" if backend == "jax" else "data_parallel"
    # The data is missing too: the strategy must be refused first, naming
    # this backend and what to use instead.
    missing = str(tmp_path / "none")
    with pytest.raises(kt.StrategyError, match=(
            f"strategy='{name}'.*'{backend}'.*(use strategy=|set "
            "KERAS_BACKEND=)")):
        vtab.run(tiny(), ["dtd"], data_dir=missing, strategy=name,
                 verbose=False)
    assert cli.main(["vtab", "x.keras", "--tasks", "dtd", "--data-dir",
                     missing, "--strategy", name]) == 2
    err = capsys.readouterr().err
    assert f"'{backend}'" in err and "KERAS_BACKEND=" in err, err
    assert "tfds build" not in err
