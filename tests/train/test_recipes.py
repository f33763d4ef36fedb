"""keras_vit.train.recipes: a recipe's fields are checked (names, choices,
ranges) and a short run's warmup is scaled, never the user's."""

import pytest

from testkit import bad_calls_test
import keras_vit
from testkit import one_error_line as _one_error_line
from keras_vit import train as kt


def test_a_short_run_scales_the_recipes_warmup(capsys):
    from keras_vit.cli import train as train_cli
    from keras_vit.train import recipes

    with pytest.warns(UserWarning, match=r"warmup_steps=250 do not fit a run "
                                         r"of total_steps=7; warming up for "
                                         r"1 steps instead \(10%\)"):
        recipe = recipes.get("finetune", total_steps=7)
    assert recipe.warmup_steps == 1
    with pytest.warns(UserWarning, match="warming up for 0 steps"):
        assert recipes.get("finetune", total_steps=1).warmup_steps == 0
    assert recipes.get("finetune", total_steps=500).warmup_steps == 250
    # A warmup the user chose is never changed: the error names options.
    with pytest.raises(ValueError, match=r"warmup_steps=5 \(--warmup-steps\) "
                                         r"must be smaller than total_steps=3 "
                                         r"\(--steps\)"):
        recipes.get("finetune", total_steps=3, warmup_steps=5)
    assert train_cli.main(["fine-tune", "ViT-Ti/16", "--data", "digits",
                           "--steps", "3", "--warmup-steps", "5"]) == 2
    assert "(--warmup-steps) must be smaller" in _one_error_line(capsys)


# Bad arguments to recipes.get, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("recipe name", lambda: kt.recipes.get("fintune"), "recipe",
     "'fintune'", "finetune"),
    ("recipe field", lambda: kt.recipes.get("finetune", learning_rat=1.0),
     "field", "'learning_rat'", "did you mean 'learning_rate'"),
    ("recipe optimizer", lambda: kt.recipes.get("finetune", optimizer="adm"),
     "optimizer", "'adm'", "adam"),
    ("recipe schedule", lambda: kt.recipes.get("finetune",
                                               schedule="cosin"),
     "schedule", "'cosin'", "cosine"),
    ("recipe precision", lambda: kt.recipes.get(
        "finetune", precision="mixed_bfloat"), "precision",
     "'mixed_bfloat'", "mixed_bfloat16"),
    ("recipe classifier", lambda: kt.recipes.get("finetune",
                                                 classifier="gpa"),
     "classifier", "'gpa'", "gap"),
    ("recipe learning_rate", lambda: kt.recipes.get(
        "finetune", learning_rate=-1.0), "learning_rate", "-1.0",
     "(0.0, 10.0]"),
    ("recipe label_smoothing", lambda: kt.recipes.get(
        "finetune", label_smoothing=2.0), "label_smoothing", "2.0",
     "[0.0, 1.0)"),
    ("recipe batch_size", lambda: kt.recipes.get("finetune", batch_size=0),
     "batch_size", "0", "an integer in [1, 1048576]"),
    ("recipe optimizer lamb", lambda: kt.recipes.get(
        "deit3", optimizer="lambb"), "optimizer", "'lambb'", "lamb"),
    ("recipe mixup_alpha", lambda: kt.recipes.get(
        "deit", mixup_alpha=-0.5), "mixup_alpha", "-0.5", "[0.0, 100.0]"),
    ("recipe mix_switch_prob", lambda: kt.recipes.get(
        "deit", mix_switch_prob=1.5), "mix_switch_prob", "1.5",
     "[0.0, 1.0]"),
    ("recipe randaugment magnitude", lambda: kt.recipes.get(
        "deit", randaugment=(2, 15)), "randaugment magnitude", "15",
     "[0.0, 10.0]"),
    ("recipe randaugment shape", lambda: kt.recipes.get(
        "deit", randaugment=9), "randaugment", "9", "(num_ops, magnitude)"),
    ("recipe randaugment magnitude_std", lambda: kt.recipes.get(
        "deit", randaugment=(2, 9, -0.5)), "randaugment magnitude_std",
     "-0.5", "[0.0, 10.0]"),
    ("recipe random_erasing", lambda: kt.recipes.get(
        "deit", random_erasing=-0.25), "random_erasing", "-0.25",
     "[0.0, 1.0]"),
    ("recipe drop_path_rate", lambda: kt.recipes.get(
        "deit", drop_path_rate=1.0), "drop_path_rate", "1.0", "[0.0, 1.0)"),
    ("recipe loss", lambda: kt.recipes.get("deit", loss="bc"), "loss",
     "'bc'", "bce"),
    ("recipe bce with label smoothing", lambda: kt.recipes.get(
        "deit", loss="bce"), "label_smoothing", "0.1",
     "every class in every target"),
    ("recipe three_augment", lambda: kt.recipes.get(
        "deit3", three_augment="yes"), "three_augment", "'yes'",
     "True or False"),
    ("recipe dense targets need num_classes", lambda: (
        kt.recipes.pipeline_options(kt.recipes.get("deit"))),
     "num_classes", "num_classes=None", "rows of num_classes"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)


# ImageNet-1k epochs of 1,281,167 images, full batches only.
IMAGENET_STEPS = {1024: 1251, 2048: 625}


def test_named_recipes_hold_their_sources_values():
    from keras_vit.train import recipes

    augreg = recipes.get("augreg")
    assert (augreg.optimizer, augreg.learning_rate, augreg.weight_decay,
            augreg.batch_size, augreg.epochs, augreg.warmup_steps,
            augreg.grad_clip_norm) == ("adam", 1e-3, 0.1, 4096, 300,
                                       10_000, 1.0)
    assert (augreg.dropout_rate, augreg.drop_path_rate, augreg.mixup_alpha,
            augreg.cutmix_alpha, augreg.randaugment) == (
                0.1, 0.1, 0.5, 0.0, (2, 10.0))
    deit = recipes.get("deit")
    assert deit.learning_rate == 5e-4 * deit.batch_size / 512
    assert deit.warmup_steps == 5 * IMAGENET_STEPS[deit.batch_size]
    assert (deit.weight_decay, deit.label_smoothing, deit.drop_path_rate,
            deit.randaugment, deit.mixup_alpha, deit.cutmix_alpha,
            deit.mix_switch_prob, deit.random_erasing, deit.ema_decay,
            deit.crop_area, deit.epochs) == (
                0.05, 0.1, 0.1, (2, 9.0, 0.5), 0.8, 1.0, 0.5, 0.25, 0.99996,
                (0.08, 1.0), 300)
    deit3 = recipes.get("deit3")
    assert deit3.warmup_steps == 5 * IMAGENET_STEPS[deit3.batch_size]
    assert (deit3.optimizer, deit3.learning_rate, deit3.loss,
            deit3.label_smoothing, deit3.three_augment, deit3.color_jitter,
            deit3.randaugment, deit3.random_erasing, deit3.drop_path_rate,
            deit3.image_size, deit3.epochs) == (
                "lamb", 3e-3, "bce", 0.0, True, 0.3, None, 0.0, 0.2, 192,
                800)
    # The paper's recipes: every new field off.
    for name in ("finetune", "finetune-imagenet", "pretrain",
                 "pretrain-imagenet", "pretrain-jft", "mpp"):
        r = recipes.get(name)
        assert not (r.mixes or r.dense_targets or r.randaugment
                    or r.random_erasing or r.three_augment or r.color_jitter
                    or r.drop_path_rate) and r.layer_decay is None, name
        assert recipes.batch_mixer(r, 10) is None
    # (Its EMA, 0.99996, would not fit 10k steps: tests/train/
    # test_recipes_fit_the_run.py.)
    lamb = recipes.make_optimizer(deit3.replace(ema_decay=None), 10_000)
    assert type(lamb).__name__ == "Lamb" and lamb.weight_decay == 0.05
    assert recipes.parse_value("randaugment", "2,9") == (2, 9.0)
    assert recipes.parse_value("randaugment", "2,9,0.5") == (2, 9.0, 0.5)
    assert recipes.parse_value("layer_decay", "none") is None
    assert recipes.parse_value("three_augment", "true") is True
    assert recipes.get("deit").to_dict()["randaugment"] == [2, 9.0, 0.5]


def test_the_pieces_train_with_model_fit():
    import keras
    import numpy as np
    from keras_vit.train import recipes

    # Layer decay, stochastic depth, MixUp / CutMix and DeiT III's BCE loss
    # (3-Augment and the other augmentations: tests/train/test_data.py).
    r = recipes.get("finetune", total_steps=2, warmup_steps=1, batch_size=8,
                    image_size=16, layer_decay=0.75, drop_path_rate=0.1,
                    mixup_alpha=0.8, cutmix_alpha=1.0, loss="bce")
    keras.utils.set_random_seed(0)
    model = keras_vit.vit(image_size=16, patch_size=4, hidden_size=32,
                          num_layers=2, num_heads=2, mlp_dim=64,
                          num_classes=10, **recipes.model_options(r))
    assert model.get_layer("encoder_block_1").drop_path_rate == \
        r.drop_path_rate
    train = kt.dataset("digits", r.image_size, r.batch_size,
                       **recipes.pipeline_options(r, num_classes=10))
    model.compile(optimizer=recipes.make_optimizer(
                      r, 2, clip_in_optimizer=True, model=model),
                  loss=recipes.make_loss(r), jit_compile=False)
    history = model.fit(train, epochs=1, steps_per_epoch=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert int(model.optimizer.iterations.numpy()) == 2
    # Evaluation batches keep integer labels; the loss takes them too.
    loss = model.evaluate(kt.dataset("digits:test", 16, 8, training=False,
                                     take=16), verbose=0)
    assert np.isfinite(loss)


# augreg's pieces are a subset of deit's. ``passed``: what the user gives
# the Trainer; ``expected``: the values each piece must then hold (the
# papers' numbers where nothing is passed: DeiT's stochastic depth 0.1 and
# label smoothing 0.1, DeiT III's 0.2 and BCE; MixUp 0.8 / CutMix 1.0).
@pytest.mark.parametrize("name,passed,expected", [
    ("deit", {}, dict(drop_path_rate=0.1, loss="SoftTargetCrossentropy",
                      label_smoothing=0.1)),
    ("deit", dict(drop_path_rate=0.3, label_smoothing=0.2, mixup_alpha=0.4,
                  cutmix_alpha=0.0),
     dict(drop_path_rate=0.3, loss="SoftTargetCrossentropy",
          label_smoothing=0.2, mixup_alpha=0.4, cutmix_alpha=0.0)),
    ("deit3", {}, dict(drop_path_rate=0.2, loss="BinaryMixedTargets")),
], ids=["deit", "deit-passed", "deit3"])
def test_the_trainer_applies_the_family_recipes(name, passed, expected):
    """keras-vit fine-tune's Trainer runs model.fit with every piece of a
    family recipe: stochastic depth in the model, augmentation and batch
    mixing in its input, the recipe's loss, layer decay in the optimizer;
    each at the value the user passed, else the paper's."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    tiny = keras_vit.vit(16, 4, 32, 2, 2, 64, 10)
    trainer = kt.Trainer(tiny, "digits", recipe=name, total_steps=2,
                         warmup_steps=1, batch_size=8, layer_decay=0.75,
                         strategy="default", verbose=False, **passed)
    model = trainer.model
    assert model.get_config()["drop_path_rate"] == expected["drop_path_rate"]
    assert type(model.loss).__name__ == expected["loss"]
    if "label_smoothing" in expected:
        assert model.loss.label_smoothing == expected["label_smoothing"]
    mixer = kt.recipes.batch_mixer(trainer.recipe, 10)
    assert (mixer.mixup_alpha, mixer.cutmix_alpha) == (
        expected.get("mixup_alpha", 0.8), expected.get("cutmix_alpha", 1.0))
    # Layer decay 0.75 over 2 blocks: the patch embedding (layer 0) trains
    # at 0.75 ** 3 of the rate, the head at the full rate.
    scales = trainer.optimizer.variable_scales
    assert scales["patch_embedding/conv/kernel"] == pytest.approx(0.75 ** 3)
    assert scales[model.get_layer("head").kernel.path] == 1.0
    # model.fit's compile (compile_for_finetune) is the Trainer's: the same
    # loss and metrics (top-1 accuracy that reads the mixed training rows
    # and the integer evaluation labels alike).
    alone = keras_vit.vit(16, 4, 32, 2, 2, 64, 10)
    kt.compile_for_finetune(alone, name, total_steps=2, warmup_steps=1,
                            batch_size=8, layer_decay=0.75, **passed)
    for key in ("loss", "metrics"):
        assert alone.get_compile_config()[key] == (
            model.get_compile_config()[key]), key
    assert type(model.metrics[-1]).__name__ == "CompileMetrics"
    images, targets = next(iter(trainer._batches(0, 2)))
    # Mixed batches carry soft targets over the 10 classes.
    assert tuple(targets.shape) == (8, 10) and images.shape[0] == 8
    run = trainer.fit()
    assert run.metrics["final_step"] == 2
    assert np.isfinite(run.metrics["train_loss"])
