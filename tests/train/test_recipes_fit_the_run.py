"""A recipe fits the run it is given: a named recipe's warmup and weight
average shrink to a short run (with one warning line naming both values),
DeiT's learning rate follows the batch of an optimizer step, and every
number a recipe holds has both bounds, the same through ``recipes.get``,
``--set`` and every entry point that builds a recipe."""

import math
import warnings

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from keras_vit.base import limits
from keras_vit.train import recipes

# Each numeric field: (low, high, low_open, high_open, integer), the
# range its error states. Values just past an end must stop.
BOUNDS = {
    "learning_rate": (0.0, limits.MAX_LEARNING_RATE, True, False, False),
    "momentum": (0.0, 1.0, False, True, False),
    "beta_1": (0.0, 1.0, False, True, False),
    "beta_2": (0.0, 1.0, False, True, False),
    "weight_decay": (0.0, limits.MAX_WEIGHT_DECAY, False, False, False),
    "label_smoothing": (0.0, 1.0, False, True, False),
    "dropout_rate": (0.0, 1.0, False, True, False),
    "eval_crop": (0.0, 1.0, True, False, False),
    "ema_decay": (0.0, 1.0, True, True, False),
    "epochs": (0.0, limits.MAX_EPOCHS, True, False, False),
    "mixup_alpha": (0.0, limits.MAX_MIX_ALPHA, False, False, False),
    "cutmix_alpha": (0.0, limits.MAX_MIX_ALPHA, False, False, False),
    "mix_switch_prob": (0.0, 1.0, False, False, False),
    "random_erasing": (0.0, 1.0, False, False, False),
    "color_jitter": (0.0, 1.0, False, False, False),
    "drop_path_rate": (0.0, 1.0, False, True, False),
    "layer_decay": (0.0, 1.0, True, False, False),
    "total_steps": (1, limits.MAX_STEPS, False, False, True),
    "warmup_steps": (0, limits.MAX_STEPS, False, False, True),
    "batch_size": (1, limits.MAX_BATCH_SIZE, False, False, True),
    "micro_batch_size": (1, limits.MAX_BATCH_SIZE, False, False, True),
    "image_size": (1, limits.MAX_IMAGE_SIDE, False, False, True),
    "checkpoint_every": (1, limits.MAX_STEPS, False, False, True),
    "log_every": (1, limits.MAX_STEPS, False, False, True),
    "eval_every": (1, limits.MAX_STEPS, False, False, True),
    "seed": (0, limits.MAX_SEED, False, False, True),
}


def test_every_numeric_field_has_both_bounds():
    """The table above covers every number a recipe holds (a new field
    must say its bounds here)."""
    import dataclasses

    numeric = {f.name for f in dataclasses.fields(recipes.Recipe)
               if f.name not in ("name", "optimizer", "schedule",
                                 "precision", "jit_compile", "flip",
                                 "three_augment", "loss",
                                 "scale_lr_with_batch")}
    # Tuples, checked by their own tests below; grad_clip_norm has no cap
    # on purpose (a norm past every gradient clips nothing, as None).
    numeric -= {"lr_sweep", "crop_area", "randaugment", "grad_clip_norm"}
    assert numeric == set(BOUNDS)


def _inside(field, value):
    low, high, low_open, high_open, _ = BOUNDS[field]
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return ((value > low if low_open else value >= low)
            and (value < high if high_open else value <= high))


@st.composite
def out_of_bounds(draw):
    field = draw(st.sampled_from(sorted(BOUNDS)))
    low, high, _, _, integer = BOUNDS[field]
    if integer:
        value = draw(st.one_of(st.integers(max_value=low - 1),
                               st.integers(high + 1, 10**30)))
    else:
        value = draw(st.one_of(
            st.floats(), st.sampled_from([low, high]),
            st.floats(max_value=float(low)),
            st.floats(min_value=float(high))))
    assume(not _inside(field, value))
    return field, value


def _stops_naming(call, field, text):
    with pytest.raises(ValueError) as caught:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
    message = str(caught.value)
    assert "\n" not in message, message
    assert f"{field}=" in message, message
    assert text in message, message


@settings(max_examples=200, deadline=None)
@given(case=out_of_bounds())
def test_every_value_out_of_bounds_stops_in_one_line(case):
    """Python (``recipes.get(**overrides)``, ``Recipe.replace``) and the
    command line's ``--set`` text (``parse_value``) stop a value outside
    a field's bounds with one line naming the field and the value."""
    field, value = case
    # MixUp and CutMix are DeiT's; every other field is any recipe's.
    name = "deit" if field in ("mixup_alpha", "cutmix_alpha") else "finetune"
    echoed = f"{field}={value!r}"
    _stops_naming(lambda: recipes.get(name, **{field: value}), field,
                  echoed)
    _stops_naming(lambda: recipes.get(name).replace(**{field: value}),
                  field, echoed)
    text = str(value)
    _stops_naming(lambda: recipes.get(
        name, **{field: recipes.parse_value(field, text)}), field, "")


@pytest.mark.parametrize("text, named, echoed", [
    # A billion RandAugment passes over each image once ran silent.
    ("1000000000,9", "randaugment num_ops", "1000000000"),
    ("0,9", "randaugment num_ops", "0"),
    ("2,11", "randaugment magnitude", "11.0"),
    ("2,9,-1", "randaugment magnitude_std", "-1.0"),
])
def test_randaugment_has_both_bounds(text, named, echoed):
    value = recipes.parse_value("randaugment", text)
    _stops_naming(lambda: recipes.get("deit", randaugment=value), named,
                  f"{named}={echoed}")


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True),
                       min_size=1, max_size=3))
def test_a_learning_rate_sweep_holds_learning_rates(values):
    ok = all(0 < v <= limits.MAX_LEARNING_RATE for v in values)

    def call():
        return recipes.get("finetune", lr_sweep=tuple(values))

    if ok:
        assert call().lr_sweep == tuple(values)
    else:
        _stops_naming(call, "lr_sweep", "")


def test_the_command_line_stops_before_anything_runs(capsys):
    """``--set`` and the direct options stop in one line, before any data
    or model is loaded (the recipe is checked first)."""
    from keras_vit.cli import train as train_cli

    for extra, named in (
            (["--set", "randaugment=1000000000,9"], "randaugment num_ops"),
            (["--set", "mixup_alpha=1e9"], "mixup_alpha"),
            (["--steps", "100", "--ema", "0.9999"], "ema_decay"),
            (["--set", "seed=99999999999"], "seed"),
            # The direct options: argparse's own range or the recipe's.
            (["--batch-size", "2000000"], "batch"),
            (["--lr", "1e6"], "l")):
        status = train_cli.main(["fine-tune", "ViT-Ti/16", "--data",
                                 "digits", "--recipe", "deit", *extra])
        assert status == 2, extra
        err = capsys.readouterr().err
        # One error line (a warning on the warmup may come before it).
        errors = [line for line in err.splitlines() if " error: " in line]
        assert len(errors) == 1 and "Traceback" not in err, err
        assert named in errors[0], (extra, err)


# -- the weight average -------------------------------------------------------


def test_a_short_run_shortens_the_named_recipes_average():
    recipes._WARNED.clear()
    with pytest.warns(UserWarning) as caught:
        r = recipes.get("deit", total_steps=120)
    text = " ".join(str(w.message) for w in caught)
    assert ("ema_decay=0.99996 averages the weights over ~25000 steps" in text
            and "using ema_decay=0.983333 instead (a horizon of 60 steps)"
            in text), text
    # At most half the run: the starting weights keep e**-2 of the average.
    assert r.ema_decay == pytest.approx(1 - 2 / 120)
    assert r.ema_decay ** 120 == pytest.approx(math.exp(-2), rel=0.05)
    # The paper's own setting sits on the bound and is kept as it is.
    imagenet = recipes.get("finetune-imagenet")
    assert imagenet.ema_decay == 0.9999 and recipes.ema_fits(0.9999, 20_000)
    # A run of two steps has room for no average.
    with pytest.warns(UserWarning, match="using no average"):
        assert recipes.get("deit", total_steps=2).ema_decay is None
    # Long enough: the recipe's own value.
    assert recipes.get("deit", total_steps=60_000).ema_decay == 0.99996


def test_an_average_the_user_chose_is_refused_not_changed():
    with pytest.raises(ValueError, match=r"ema_decay=0\.9999 averages .* "
                                         r"total_steps=100 .*at most 0\.98,"):
        recipes.get("finetune", total_steps=100, ema_decay=0.9999)
    # Every path to an optimizer checks it, a Recipe object's too.
    epochs = recipes.get("deit").replace(ema_decay=0.999, warmup_steps=10)
    with pytest.raises(ValueError, match="ema_decay=0.999 averages"):
        recipes.make_optimizer(epochs, 500)
    with pytest.raises(ValueError, match="ema_decay=0.999 averages"):
        recipes.fit_to_run(epochs, 500, named=True,
                           overrides=("ema_decay",))


def test_a_run_counted_in_epochs_fits_once_its_length_is_known():
    """The Trainer and ``compile_for_finetune`` learn a run's length from
    the data; the named recipe's warmup and average are fitted then."""
    import keras_vit
    import keras_vit.train as kt
    from keras_vit.train import settings

    source = kt.load_data("digits")
    r = recipes.get("deit", epochs=2, batch_size=64)
    with pytest.warns(UserWarning):
        plan = settings.plan(r, source, replicas=1, strategy_name="default",
                             named=True, overrides=("epochs", "batch_size"))
    total = plan.total_steps
    assert total == math.ceil(2 * source.num_examples / 64)
    assert plan.recipe.ema_decay == pytest.approx(1 - 2 / total)
    assert plan.recipe.warmup_steps == round(0.1 * total)
    model = keras_vit.vit(16, 4, 16, 1, 2, 32, 10)
    with pytest.warns(UserWarning):
        fitted = kt.compile_for_finetune(model, "deit", epochs=2,
                                         steps_per_epoch=20, batch_size=64,
                                         check_memory=False)
    assert fitted.ema_decay == pytest.approx(1 - 2 / 40)
    assert float(model.optimizer.ema_momentum) == pytest.approx(
        fitted.ema_decay)
    with pytest.raises(ValueError, match="ema_decay=0.999 averages"):
        kt.compile_for_finetune(model, "deit", epochs=2, steps_per_epoch=20,
                                batch_size=64, ema_decay=0.999,
                                check_memory=False)


# -- the learning rate and the batch --------------------------------------


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, limits.MAX_BATCH_SIZE),
       micro=st.sampled_from([None, 1, 2, 4]))
def test_deit_scales_its_rate_with_the_batch_of_a_step(batch, micro):
    """DeiT's rule, 5e-4 per 512 images of an optimizer step, whatever
    the split into micro-batches (gradient accumulation: the same step)."""
    if micro is not None:
        batch = max(micro, batch - batch % micro)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = recipes.get("deit", batch_size=batch, micro_batch_size=micro)
    assert r.learning_rate == pytest.approx(5e-4 * batch / 512)
    assert 0 < r.learning_rate <= limits.MAX_LEARNING_RATE
    # An explicit rate wins; a recipe that does not scale keeps its own.
    assert recipes.get("deit", batch_size=batch,
                       learning_rate=0.1).learning_rate == 0.1
    assert recipes.get("deit3", batch_size=batch).learning_rate == 3e-3


def test_the_trainer_keeps_the_scaled_rate():
    """The head's rate (Appendix D.3) is looked up again once the model is
    built: at the run's batch, not the recipe's 1024."""
    import keras_vit
    from keras_vit.train import settings

    model = keras_vit.vit(16, 4, 16, 1, 2, 32, 10)
    r = recipes.get("deit", batch_size=64, total_steps=10_000)
    fitted = settings.fit_to_model(r, model, image_size=16, name="deit",
                                   overrides=("batch_size",))
    assert fitted.learning_rate == pytest.approx(5e-4 * 64 / 512)
