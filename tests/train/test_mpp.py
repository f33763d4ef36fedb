"""keras_vit.train.mpp: masked patch prediction (paper Appendix B.1.2).

The corruption statistics are measured over many batches against the
paper's 50% and 80/10/10 with tolerances from the binomial standard
deviation; the targets and the loss are checked against plain NumPy loops;
the model's corruption against the patch embeddings computed on their own.
"""

import json
import math
import os

import numpy as np
import pytest

from testkit import bad_calls_test
import keras
import keras_vit
from keras_vit import cli
from keras_vit import train as kt
from keras_vit.train import mpp, recipes

TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64, num_classes=10)
QUICK = dict(batch_size=16, crop_area=None, log_every=5, strategy="default",
             verbose=False)
# Four standard deviations: a correct sampler fails one check in ~16,000.
Z = 4.0


def tiny(seed=1, **kwargs):
    keras.utils.set_random_seed(seed)
    return keras_vit.vit(**dict(TINY, **kwargs))


def test_recipe_holds_the_papers_values():
    r = recipes.get("mpp")
    assert (r.optimizer, r.beta_1, r.beta_2) == ("adam", 0.9, 0.999)
    assert (r.learning_rate, r.warmup_steps, r.schedule) == (2e-4, 10_000,
                                                             "cosine")
    assert (r.batch_size, r.total_steps, r.weight_decay) == (4096, 100_000,
                                                             0.0)
    schedule = recipes.learning_rate_schedule(r, r.total_steps)
    assert float(schedule(10_000)) == pytest.approx(2e-4)
    assert float(schedule(55_000)) == pytest.approx(1e-4, rel=1e-3)


# --------------------------------------------------------------------------
# the corruption


def _within(count, n, p, what):
    sd = math.sqrt(n * p * (1 - p))
    assert abs(count - n * p) <= Z * sd, (
        f"{what}: {count} of {n} = {count / n:.5f}, expected {p} "
        f"+- {Z * sd / n:.5f}")


def test_corruption_statistics_match_50_and_80_10_10():
    batches, batch, patches = 200, 32, 64
    counts = np.zeros(4, "int64")
    source_hits = np.zeros(batch * patches, "int64")
    per_position = np.zeros(patches, "int64")
    for i in range(batches):
        mode, source = mpp.corruption_plan(batch, patches, (7, i))
        mode, source = mode.numpy(), source.numpy()
        counts += np.bincount(mode.ravel(), minlength=4)
        per_position += (mode != mpp.KEEP).sum(0)
        own = np.arange(batch * patches).reshape(batch, patches)
        # Another patch of the batch, never the patch itself.
        assert (source != own).all()
        assert source.min() >= 0 and source.max() < batch * patches
        source_hits += np.bincount(source.ravel(), minlength=batch * patches)
    total = batches * batch * patches
    chosen = total - counts[mpp.KEEP]
    _within(chosen, total, 0.5, "corrupted")
    _within(counts[mpp.MASK], chosen, 0.8, "[mask] of corrupted")
    _within(counts[mpp.RANDOM], chosen, 0.1, "random patch of corrupted")
    _within(counts[mpp.UNCHANGED], chosen, 0.1, "unchanged of corrupted")
    # No position is favoured (each is a binomial of batches * batch draws),
    # and the replacement is uniform over the batch's patches.
    for n in per_position:
        _within(n, batches * batch, 0.5, "one position")
    expected = total / (batch * patches)
    chi2 = ((source_hits - expected) ** 2 / expected).sum()
    dof = batch * patches - 1
    assert abs(chi2 - dof) < Z * math.sqrt(2 * dof), chi2
    # Seeded: the same seed gives the same plan, another seed another.
    a, _ = mpp.corruption_plan(batch, patches, (7, 0))
    b, _ = mpp.corruption_plan(batch, patches, (7, 1))
    again, _ = mpp.corruption_plan(batch, patches, (7, 0))
    assert (a.numpy() == again.numpy()).all()
    assert (a.numpy() != b.numpy()).any()


def test_other_rates_and_bad_fractions():
    mode, _ = mpp.corruption_plan(64, 100, (1, 2), rate=0.15,
                                  mask_fraction=1.0, random_fraction=0.0)
    mode = mode.numpy()
    _within((mode != mpp.KEEP).sum(), mode.size, 0.15, "15% corrupted")
    assert set(np.unique(mode)) <= {mpp.KEEP, mpp.MASK}
    with pytest.raises(ValueError, match="corruption_rate=0.0"):
        mpp.corruption_plan(2, 4, (0, 0), rate=0.0)
    with pytest.raises(ValueError, match="mask_fraction \\+ random_fraction"):
        mpp.corruption_plan(2, 4, (0, 0), mask_fraction=0.95)
    with pytest.raises(ValueError, match="at least two patches"):
        mpp.corruption_plan(1, 1, (0, 0))


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_the_model_corrupts_patch_embeddings_as_planned(classifier):
    # Headless: calling it gives the ViT's tokens after encoder_norm.
    encoder = tiny(classifier=classifier, include_top=False)
    model = mpp.MaskedPatchPrediction(encoder)
    corrupted = keras.Model(model.inputs,
                            model.get_layer("patch_corruption").output)
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    mode, source = model.plan(4, (3, 4))
    mode, source = mode.numpy(), source.numpy()
    assert {mpp.MASK, mpp.RANDOM, mpp.KEEP} <= set(np.unique(mode))
    clean = np.asarray(encoder.get_layer("patch_embedding")(images))
    out = np.asarray(corrupted([images, mode, source]))
    flat = clean.reshape(-1, clean.shape[-1])
    mask = model.get_layer("patch_corruption").mask_embedding.numpy()
    for b in range(4):
        for n in range(model.num_patches):
            want = {mpp.MASK: mask, mpp.RANDOM: flat[source[b, n]]}.get(
                mode[b, n], clean[b, n])
            np.testing.assert_allclose(out[b, n], want, atol=1e-6)
    # The layers are the ViT's own: same weights, no copy.
    assert model.get_layer("encoder_block_0") is encoder.get_layer(
        "encoder_block_0")
    # An empty plan leaves the ViT's tokens as they are.
    keep = np.zeros_like(mode)
    features = keras.Model(model.inputs, model.get_layer("mpp_head").input)
    ref = np.asarray(encoder(images))
    if classifier == "token":
        ref = ref[:, 1:]
    np.testing.assert_allclose(features([images, keep, source]), ref,
                               atol=1e-5)


# --------------------------------------------------------------------------
# the targets and the loss, against NumPy


def _np_class(pixels):
    levels = np.clip(np.floor((pixels + 1.0) * 4.0), 0, 7).astype(int)
    return levels[..., 0] * 64 + levels[..., 1] * 8 + levels[..., 2]


def _np_targets(images, patch, target):
    b, h, w, _ = images.shape
    out = []
    for i in range(b):
        row = []
        for r in range(h // patch):
            for c in range(w // patch):
                p = images[i, r * patch:(r + 1) * patch,
                           c * patch:(c + 1) * patch]
                if target == "mean_color":
                    row.append(_np_class(p.mean((0, 1))))
                elif target == "color_4x4":
                    s = patch // 4
                    cells = [_np_class(p[y * s:(y + 1) * s,
                                         x * s:(x + 1) * s].mean((0, 1)))
                             for y in range(4) for x in range(4)]
                    row.append(cells)
                else:
                    row.append(p.reshape(-1))
        out.append(row)
    return np.asarray(out)


@pytest.mark.parametrize("target", mpp.TARGETS)
@pytest.mark.parametrize("patch", [4, 8])
def test_targets_match_numpy(target, patch):
    rng = np.random.default_rng(patch)
    images = rng.uniform(-1, 1, (3, 32, 24, 3)).astype("float32")
    images[0, :patch, :patch] = 1.0   # the top bin: class 511
    images[0, :patch, patch:2 * patch] = -1.0  # the bottom bin: class 0
    got = mpp.patch_targets(images, (32 // patch, 24 // patch),
                            target).numpy()
    want = _np_targets(images, patch, target)
    assert got.shape == want.shape
    if target == "l2":
        np.testing.assert_allclose(got, want, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)
        if target == "mean_color":
            assert got[0, 0] == 511 and got[0, 1] == 0


def test_4x4_target_of_a_patch_side_not_divisible_by_4():
    # ViT-H/14's case: the image is area-resized to 4 pixels per patch side.
    images = np.full((1, 28, 28, 3), -1.0, "float32")
    images[:, :14, :14] = 1.0
    got = mpp.patch_targets(images, (2, 2), "color_4x4").numpy()
    assert got.shape == (1, 4, 16)
    assert (got[0, 0] == 511).all() and (got[0, 1:] == 0).all()


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("target", mpp.TARGETS)
def test_loss_counts_corrupted_patches_only(target):
    rng = np.random.default_rng(1)
    b, n, k = 3, 6, {"mean_color": 512, "color_4x4": 16 * 512,
                     "l2": 4 * 4 * 3}[target]
    predictions = rng.normal(size=(b, n, k)).astype("float32")
    images = rng.uniform(-1, 1, (b, 8, 12, 3)).astype("float32")
    targets = mpp.patch_targets(images, (2, 3), target).numpy()
    mode = rng.integers(0, 4, (b, n)).astype("int32")
    mode[0] = mpp.KEEP  # an image with nothing corrupted: loss 0
    loss, right = (t.numpy() for t in mpp.masked_loss(
        predictions, targets, mode, target))
    for i in range(b):
        sel = mode[i] != mpp.KEEP
        if not sel.any():
            assert loss[i] == 0 and right[i] == 0
            continue
        if target == "l2":
            per = ((predictions[i] - targets[i]) ** 2).mean(-1)
            pred_c = _np_class(predictions[i].reshape(n, -1, 3).mean(1))
            true_c = _np_class(targets[i].reshape(n, -1, 3).mean(1))
            hit = (pred_c == true_c).astype(float)
        else:
            logits = predictions[i].reshape(n, -1, 512)
            t = targets[i].reshape(n, -1)
            logp = _np_log_softmax(logits.astype("float64"))
            per = -np.take_along_axis(logp, t[..., None], -1)[..., 0].mean(-1)
            hit = (logits.argmax(-1) == t).mean(-1)
        assert loss[i] == pytest.approx(per[sel].mean(), rel=1e-4)
        assert right[i] == pytest.approx(hit[sel].mean(), abs=1e-6)


def test_first_loss_is_log_512_with_the_zero_head():
    model = mpp.MaskedPatchPrediction(tiny())
    images = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3))
    loss, _ = model.loss_terms(images.astype("float32"), (0, 0))
    np.testing.assert_allclose(loss.numpy(), math.log(512), rtol=1e-5)


def test_targets_follow_the_models_own_preprocessing():
    # A ViT that takes [0, 255] pixels: black is class 0 (raw 0.0 read as
    # [-1, 1] would be mid-grey, class 292).
    model = mpp.MaskedPatchPrediction(tiny(include_preprocessing=True))
    bias = np.full(512, -20.0, "float32")
    bias[0] = 20.0
    model.get_layer("mpp_head").bias.assign(bias)
    loss, right = model.loss_terms(np.zeros((2, 16, 16, 3)), (0, 0))
    assert loss.numpy().max() < 1e-6 and (right.numpy() == 1).all()


# --------------------------------------------------------------------------
# training, saving, fine-tuning


def test_training_lowers_the_loss_and_resumes_exactly(tmp_path):
    kw = dict(QUICK, learning_rate=3e-3, warmup_steps=2, total_steps=12)
    full = kt.pretrain_mpp(tiny(), "digits", out_dir=tmp_path / "a", **kw)
    losses = [row["loss"] for row in full.metrics["history"]]
    assert losses[-1] < losses[0] - 0.1, losses
    assert losses[0] < math.log(512) + 0.01
    assert full.metrics["objective"]["target"] == "mean_color"
    assert 0.0 < full.metrics["train_accuracy"] <= 1.0
    with open(tmp_path / "a" / "run.json") as f:
        assert json.load(f)["objective"]["corruption_rate"] == 0.5
    # Stopped at step 5 and resumed: the corruption draws depend on the
    # step only, so the weights equal those of the uninterrupted run.
    part = kt.MppTrainer(tiny(), "digits", out_dir=tmp_path / "b", **kw)
    part.fit(stop_at_step=5)
    resumed = kt.MppTrainer(tiny(), "digits", out_dir=tmp_path / "b", **kw)
    assert resumed.resumed_from == 5
    done = resumed.fit()
    for x, y in zip(full.model.get_weights(), done.model.get_weights()):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_save_load_and_classifier_from_the_encoder(tmp_path):
    model = mpp.MaskedPatchPrediction(tiny(), target="color_4x4")
    for v in model.trainable_variables:  # not the zero initial head
        v.assign(np.random.default_rng(0).normal(
            0, 0.05, v.shape).astype("float32"))
    path = tmp_path / "mpp.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    assert isinstance(loaded, mpp.MaskedPatchPrediction)
    assert loaded.target == "color_4x4" and loaded.num_patches == 16
    images = np.random.default_rng(1).uniform(-1, 1, (2, 16, 16, 3))
    mode, source = (t.numpy() for t in model.plan(2, (5, 5)))
    inputs = [images.astype("float32"), mode, source]
    np.testing.assert_allclose(loaded(inputs), model(inputs), atol=1e-5)

    clf = kt.mpp_to_classifier(path, num_classes=3)
    assert isinstance(clf, keras_vit.VisionTransformer)
    assert (clf.get_layer("head").kernel.numpy() == 0).all()
    for name in ("patch_embedding", "class_token", "position_embedding",
                 "encoder_block_0", "encoder_norm"):
        for a, b in zip(clf.get_layer(name).get_weights(),
                        model.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)
    # At another resolution the position embeddings are resized.
    big = kt.mpp_to_classifier(model, num_classes=3, image_size=24)
    assert big.get_layer("position_embedding").pos_embedding.shape == (
        1, 37, 32)
    # fine_tune takes the .keras file directly (a zero head, then SGD).
    run = kt.fine_tune(str(path), "digits", "digits:test", total_steps=6,
                       warmup_steps=1, learning_rate=0.03, **QUICK)
    assert run.metrics["num_classes"] == 10
    assert 0.0 <= run.metrics["eval"]["accuracy"] <= 1.0
    with pytest.raises(FileNotFoundError, match="No masked patch"):
        kt.mpp_to_classifier(tmp_path / "nothing", num_classes=3)


@pytest.mark.parametrize("kwargs", [
    dict(classifier="gap", class_token=True), dict(num_registers=2),
    dict(classifier="token_gap", num_registers=1)])
def test_every_prefix_token_is_dropped_before_the_prediction(kwargs):
    """One prediction per patch, whatever tokens lead the sequence: a
    class token beside another pooling, registers."""
    model = mpp.MaskedPatchPrediction(tiny(**kwargs))
    assert model.output.shape[1:] == (16, 512)


def test_hybrid_and_gap_encoders():
    keras.utils.set_random_seed(0)
    hybrid = keras_vit.vit(32, 2, 32, 1, 2, 64, 10,
                           resnet=dict(num_layers=()))
    model = mpp.MaskedPatchPrediction(hybrid, target="l2")
    # Patches of the feature map: 8x8 pixels each (stride 4 x patch 2).
    assert model.grid_size == (4, 4) and model.pixel_patch == (8, 8)
    assert model.output.shape[-1] == 8 * 8 * 3
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3))
    loss, _ = model.loss_terms(images.astype("float32"), (1, 1))
    assert np.isfinite(loss.numpy()).all()
    clf = model.to_classifier(5)
    np.testing.assert_array_equal(
        clf.get_layer("resnet_root_conv").get_weights()[0],
        hybrid.get_layer("resnet_root_conv").get_weights()[0])
    gap = mpp.MaskedPatchPrediction(tiny(classifier="gap"))
    assert gap.output.shape[1:] == (16, 512)
    assert gap.to_classifier(4).classifier == "gap"
    assert gap.to_classifier(4, dropout_rate=0.1).dropout_rate == 0.1
    with pytest.raises(ValueError, match="received classifier='token'"):
        gap.to_classifier(4, classifier="token")


@pytest.mark.parametrize("options", [
    dict(position_embedding="none"), dict(position_embedding="sincos_2d"),
    dict(position_embedding="relative"),
    dict(position_embedding_placement="every_layer"),
    dict(return_attention_scores=True)])
def test_every_position_embedding_variant(options):
    # The wrapper replays the ViT's own graph, whatever it holds.
    encoder = tiny(include_top=False, **options)  # returns its tokens
    model = mpp.MaskedPatchPrediction(encoder)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3))
    loss, _ = model.loss_terms(images.astype("float32"), (0, 0))
    np.testing.assert_allclose(loss.numpy(), math.log(512), rtol=1e-5)
    keep = np.zeros((2, 16), "int32")
    features = keras.Model(model.inputs, model.get_layer("mpp_head").input)
    tokens = encoder(images.astype("float32"))
    if isinstance(tokens, dict):
        tokens = tokens["output"]
    np.testing.assert_allclose(features([images, keep, keep]),
                               np.asarray(tokens)[:, 1:], atol=1e-5)
    classifier = model.to_classifier(3)
    # The encoder's weights, then the classifier's head for the MPP's
    # [mask] embedding and head: one fewer.
    assert len(classifier.weights) == len(model.weights) - 1


def test_api_errors_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="target='colour'"):
        mpp.MaskedPatchPrediction(tiny(), target="colour")
    with pytest.raises(ValueError, match="corruption_rate=1.5"):
        mpp.MaskedPatchPrediction(tiny(), corruption_rate=1.5)
    with pytest.raises(ValueError, match="needs a VisionTransformer"):
        mpp.MaskedPatchPrediction(keras.Sequential([keras.Input((4,))]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(kt.DataError, match="is empty"):
        mpp.load_unlabelled(tmp_path / "empty")
    trained = mpp.MaskedPatchPrediction(tiny())
    with pytest.raises(ValueError, match="target='mean_color'; received "
                                         "target='l2'"):
        kt.MppTrainer(trained, "digits", target="l2", total_steps=2,
                      warmup_steps=1, **QUICK)
    with pytest.raises(ValueError, match="needs a VisionTransformer"):
        kt.MppTrainer("BiT-R50x1", "digits", image_size=32, total_steps=2,
                      warmup_steps=1, **QUICK)


def test_continuing_keeps_the_mask_embedding_and_head():
    trained = mpp.MaskedPatchPrediction(tiny(), target="l2")
    for v in trained.trainable_variables:
        v.assign(np.full(v.shape, 0.01, "float32"))
    trainer = kt.MppTrainer(trained, "digits", target="l2", total_steps=2,
                            warmup_steps=1, **QUICK)
    continued = trainer.trained_model()
    for a, b in zip(continued.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert continued is not trained  # rebuilt in the strategy's scope


MIRRORED_SCRIPT = """
import json, sys
import keras_vit.train as kt
kt.configure_cpu_devices(2)   # before TensorFlow starts
import keras, keras_vit
keras.utils.set_random_seed(1)
run = kt.pretrain_mpp(keras_vit.vit(16, 4, 32, 1, 2, 64, 10), "digits",
                      strategy="mirrored", total_steps=8, warmup_steps=1,
                      batch_size=16, micro_batch_size=4, learning_rate=3e-3,
                      crop_area=None, log_every=4, out_dir=sys.argv[1],
                      verbose=False)
print("RESULT " + json.dumps({k: run.metrics[k] for k in (
    "final_step", "strategy", "accumulation_steps", "history")}))
"""


@pytest.mark.slow
def test_mirrored_with_accumulation_on_two_logical_cpus(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "mirrored_mpp.py"
    script.write_text(MIRRORED_SCRIPT)
    env = dict(os.environ, KERAS_VIT_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=240,
                          env=env)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, done.stderr[-3000:]
    result = json.loads(line[0][len("RESULT "):])
    assert result["final_step"] == 8 and result["accumulation_steps"] == 2
    assert result["strategy"]["replicas"] == 2
    losses = [row["loss"] for row in result["history"]]
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] < math.log(512) + 0.01 and losses[-1] < losses[0]
    assert os.path.isfile(tmp_path / "r" / "model.keras")


# --------------------------------------------------------------------------
# command line


@pytest.fixture
def image_tree(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    root = tmp_path / "photos"
    for i in range(24):
        folder = root / ("a/b" if i % 3 == 0 else "c" if i % 3 == 1 else "")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 255, (20 + i % 5, 18, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def test_cli_pretrain_a_folder_then_fine_tune(tmp_path, image_tree, capsys):
    out = tmp_path / "run"
    argv = ["pretrain", "ViT-Ti/4", "--objective", "mpp", "--data",
            str(image_tree), "--image-size", "16", "--steps", "6",
            "--warmup-steps", "1", "--batch-size", "8", "--lr", "1e-3",
            "--model-option", "hidden_size=32", "--model-option",
            "num_layers=1", "--model-option", "num_heads=2",
            "--model-option", "mlp_dim=64", "--out", str(out),
            "--strategy", "default", "-q", "--json"]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["final_step"] == 6 and printed["train_data"] == str(
        image_tree)
    assert printed["recipe"]["name"] == "mpp"
    assert printed["objective"]["num_patches"] == 16
    assert os.path.isfile(out / "model.keras")
    assert cli.main(["fine-tune", str(out / "model.keras"), "--data",
                     "digits", "--steps", "4", "--warmup-steps", "1",
                     "--batch-size", "16", "--set", "crop_area=none",
                     "--out", str(tmp_path / "ft"), "--strategy", "default",
                     "-q", "--json"]) == 0
    tuned = json.loads(capsys.readouterr().out)
    assert tuned["final_step"] == 4 and tuned["num_classes"] == 10


def test_cli_pretrain_errors_are_one_line(tmp_path, image_tree, capsys):
    (tmp_path / "empty").mkdir()
    cases = [
        (["--data", str(tmp_path / "empty")], "is empty"),
        (["--data", str(tmp_path / "nowhere")], "does not exist"),
        (["--data", str(image_tree), "--objective", "simclr"],
         "received objective='simclr'"),
        (["--data", str(image_tree), "--target", "mean-colour"],
         "received target='mean-colour'. Did you mean 'mean_color'?"),
        (["--data", str(image_tree), "--corruption-rate", "0"],
         "corruption_rate=0.0"),
    ]
    for extra, needle in cases:
        argv = ["pretrain", "ViT-Ti/16", "--out", str(tmp_path / "r"),
                "--strategy", "default"] + extra
        assert cli.main(argv) == 2, argv
        lines = [line for line in capsys.readouterr().err.splitlines()
                 if line.startswith("keras-vit: error:")]
        assert len(lines) == 1 and needle in lines[0], (argv, lines)


# Bad arguments to the masked patch prediction objective, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("mpp target", lambda: kt.mpp.check_target("mean-colour"), "target",
     "'mean-colour'", "mean_color"),
    ("mpp objective", lambda: kt.mpp.check_objective("mppp"), "objective",
     "'mppp'", "mpp"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
