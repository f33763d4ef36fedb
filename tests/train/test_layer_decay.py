"""keras_vit.train.layer_decay: each variable's layer id is the one timm's
param_groups_layer_decay gives the same model (run side by side), and the
update each variable gets, from SGD and from AdamW with its weight decay,
is the plain optimizer's times decay ** (num_layers + 1 - layer_id)."""

import keras
import numpy as np
import pytest

from testkit import TINY
import keras_vit
from keras_vit.train import layer_decay, recipes

# timm's top-level module -> keras_vit's layer of the same weights.
TIMM_TO_OURS = {"cls_token": "class_token", "reg_token": "register_tokens",
                "dist_token": "distillation_token",
                "pos_embed": "position_embedding",
                "patch_embed": "patch_embedding", "norm_pre": "pre_norm",
                "norm": "encoder_norm", "head": "head",
                "head_dist": "head_dist", "fc_norm": "fc_norm"}


def _ours(name):
    parts = name.split(".")
    if parts[0] == "blocks":
        return f"encoder_block_{parts[1]}"
    return TIMM_TO_OURS[parts[0]]


def _tiny_vit(**kwargs):
    keras.utils.set_random_seed(0)
    return keras_vit.vit(**dict(TINY, num_layers=2, **kwargs))


@pytest.mark.parametrize("arch, options", [
    ("vit_tiny_patch16_224", {}),
    # registers, layer scale and CLIP's pre-norm in one model
    ("vit_small_patch14_reg4_dinov2", dict(num_registers=4, pre_norm=True,
                                           layer_scale=1e-5)),
    ("deit_tiny_distilled_patch16_224", dict(distilled=True)),
])
def test_layer_ids_are_timms(arch, options):
    import timm
    from timm.models import group_parameters

    theirs = timm.create_model(arch, pretrained=False, depth=2,
                               num_classes=3)
    if options.get("pre_norm"):
        theirs = timm.create_model(arch, pretrained=False, depth=2,
                                   num_classes=3, pre_norm=True)
    timm_ids = group_parameters(theirs, theirs.group_matcher(coarse=False),
                                reverse=True)
    expected = {(_ours(name), timm_ids[name])
                for name, _ in theirs.named_parameters()}
    ids, num_layers = layer_decay.layer_ids(_tiny_vit(**options))
    assert num_layers == 2
    assert {(path.split("/")[0], i) for path, i in ids.items()} == expected


def _deltas(optimizer, model, steps):
    """Each variable's change after ``steps`` updates with fixed random
    gradients, from the model's current weights (restored after)."""
    start = [np.array(v.numpy()) for v in model.trainable_variables]
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=v.shape).astype("float32")
             for v in model.trainable_variables]
    for _ in range(steps):
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads],
                        model.trainable_variables)
    deltas = {v.path: np.asarray(keras.ops.convert_to_numpy(v)) - s
              for v, s in zip(model.trainable_variables, start)}
    for v, s in zip(model.trainable_variables, start):
        v.assign(s)
    return deltas


@pytest.fixture(scope="module")
def two_blocks():
    return _tiny_vit()


@pytest.mark.backends
@pytest.mark.parametrize("make, steps", [
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.01), 1),
    (lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.05), 1),
    # Adam's moments see the same gradients: the scale holds every step
    # (scaling the gradients instead would cancel in Adam's ratio).
    (lambda: keras.optimizers.Adam(1e-2), 2),
], ids=["sgd", "adamw", "adam"])
def test_each_layer_gets_its_rate(make, steps, two_blocks):
    model, decay = two_blocks, 0.5
    plain = _deltas(make(), model, steps)
    scaled = _deltas(layer_decay.with_layer_decay(make(), model, decay),
                     model, steps)
    ids, num_layers = layer_decay.layer_ids(model)
    assert sorted(set(ids.values())) == [0, 1, 2, 3]
    for path, delta in plain.items():
        scale = decay ** (num_layers + 1 - ids[path])
        assert np.abs(delta).max() > 0, path
        # float32 rounding of the weights (|w| < 1) in each difference
        np.testing.assert_allclose(scaled[path], scale * delta, rtol=1e-5,
                                   atol=1e-7, err_msg=path)


def test_recipe_field_and_optimizer(two_blocks):
    r = recipes.get("finetune", layer_decay=0.75)
    model = two_blocks
    optimizer = recipes.make_optimizer(r, r.total_steps, model=model)
    assert optimizer.variable_scales == layer_decay.layer_scales(model, 0.75)
    assert recipes.get("finetune").layer_decay is None
    with pytest.raises(ValueError, match=r"layer_decay=0.75 needs the model"
                                         r": make_optimizer\(recipe, "
                                         r"total_steps, model=model\)"):
        recipes.make_optimizer(r, r.total_steps)
    for bad in (0.0, 1.5, -0.1, "0.5"):
        with pytest.raises(ValueError, match=r"layer_decay must be a number "
                                             r"in \(0.0, 1.0\]; received "
                                             rf"layer_decay={bad!r}$"):
            recipes.get("finetune", layer_decay=bad)
    with pytest.raises(ValueError, match=r"encoder blocks .* model "
                                         r"'plain' has none"):
        inputs = keras.Input((3,))
        layer_decay.layer_ids(keras.Model(
            inputs, keras.layers.Dense(2)(inputs), name="plain"))
