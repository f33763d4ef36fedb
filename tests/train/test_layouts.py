"""keras_vit.train.layouts: Keras' distribution API (JAX) for the zoo.

The sharding rules are checked against the real variable paths of every
family (models built without weights, in seconds), so renaming a layer
cannot silently leave a weight replicated. Training on two devices runs in
a child process: JAX must see
``XLA_FLAGS=--xla_force_host_platform_device_count=2`` and
``KERAS_BACKEND=jax`` before it is imported. Run as a script
(``python tests/train/test_layouts.py``), this file is that child.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest

# Models that between them have every kind of weight the rules know: the
# relative table and pre_logits are options of a ViT; the hybrid's ResNet
# and BiT name their convolutions differently. Blocks are all alike, so
# one or two keep the builds short.
FAMILIES = {
    "ViT-B/16": dict(image_size=224, num_classes=1000, num_layers=2),
    "ViT-S/16 relative": dict(image_size=32, num_classes=10, num_layers=2,
                              position_embedding="relative",
                              representation_size=384),
    "R26+ViT-S/32": dict(image_size=64, num_classes=10, num_layers=1),
    "BiT-M-R50x1": dict(image_size=64, num_classes=10),
    "Axial-ViT-S/16": dict(image_size=64, num_classes=10, num_layers=1),
}
# Weights left replicated on purpose, whatever their size: the position
# table (added to every token; at most 577 x D) and norms.
REPLICATED = re.compile(r"(.*/)?(pos_embedding(_x|_y)?|gamma|beta|cls)$")
BIG = 100_000  # elements; ViT-B/16's smallest kernel is 589,824


@pytest.fixture(scope="module")
def family_rules():
    from keras_vit.train import layouts

    out = {}
    for name, kwargs in FAMILIES.items():
        out[name] = (layouts.variable_shapes(name.split()[0], **kwargs),
                     layouts.layout_rules(name.split()[0], 2, **kwargs))
    return out


def test_every_rule_matches_variables_of_some_family(family_rules):
    from keras_vit.train import layouts

    used = set()
    for name, (shapes, rules) in family_rules.items():
        for pattern in rules:
            hits = [p for p in shapes if re.fullmatch(pattern, p)]
            assert hits, (name, pattern)
            used.add(pattern)
    dead = [p for _, p, _ in layouts._RULES if p not in used]
    assert not dead, f"rules matching no variable of any family: {dead}"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_big_weights_are_split_by_exactly_one_rule(family_rules, name):
    shapes, rules = family_rules[name]
    assert len(shapes) > 10
    split = 0
    for path, shape in shapes.items():
        hits = [p for p in rules if re.fullmatch(p, path)]
        # keras.distribution.LayoutMap refuses a path two keys match.
        assert len(hits) <= 1, (path, hits)
        if hits:
            axes = rules[hits[0]]
            assert len(axes) == len(shape), (path, axes, shape)
            assert axes.count("model") == 1, (path, axes)
            assert shape[axes.index("model")] % 2 == 0
            split += 1
        elif REPLICATED.fullmatch(path) is None:
            size = 1
            for s in shape:
                size *= s
            assert size <= BIG, f"{path} {shape} is replicated"
    assert split >= 4


def test_vit_b_megatron_layout(family_rules):
    shapes, rules = family_rules["ViT-B/16"]

    def axes(path):
        [hit] = [p for p in rules if re.fullmatch(p, path)]
        return rules[hit]

    block = "encoder_block_1/"
    # Column-parallel in, row-parallel out: one reduction per sub-block.
    assert axes(block + "attention/query/kernel") == (None, "model", None)
    assert axes(block + "attention/value/bias") == ("model", None)
    assert axes(block + "attention/out/kernel") == ("model", None, None)
    assert axes(block + "mlp/dense_0/kernel") == (None, "model")
    assert axes(block + "mlp/dense_1/kernel") == ("model", None)
    assert axes("head/kernel") == ("model", None)
    for path in (block + "norm_1/gamma", block + "mlp/dense_1/bias",
                 block + "attention/out/bias", "head/bias"):
        assert not any(re.fullmatch(p, path) for p in rules), path
    assert shapes[block + "attention/query/kernel"] == (768, 12, 64)


def test_model_axis_must_divide_heads_and_widths():
    import keras_vit
    from keras_vit.train import layouts

    model = keras_vit.vit(32, 8, 48, 1, 6, 96, 10)
    assert layouts.layout_rules(model, 6)
    with pytest.raises(ValueError) as e:
        layouts.layout_rules(model, 4)
    message = str(e.value)
    # Names the argument, echoes it, says what it must divide and the
    # nearest size that works.
    assert "model_parallel=4 does not divide num_heads=6" in message
    assert "the nearest that does is 3" in message
    assert "[1, 2, 3, 6]" in message
    with pytest.raises(ValueError, match=r"model_parallel=0"):
        layouts.layout_rules(model, 0)
    with pytest.raises(ValueError, match=r"model=None"):
        layouts.layout_rules(None)


def test_rules_from_a_zoo_name_allocate_nothing():
    import keras
    from keras.src.backend.common import global_state

    from keras_vit.train import layouts

    before = len(global_state.get_global_attribute(
        "uninitialized_variables") or [])
    rules = layouts.layout_rules("ViT-H/14", 16, image_size=224,
                                 num_layers=2)
    assert rules["(.*/)?mlp/dense_0/kernel"] == (None, "model")
    # Nothing left for Keras to initialise at the next stateless scope
    # (at 32 blocks, 632M parameters: 2.5 GB).
    assert len(global_state.get_global_attribute(
        "uninitialized_variables") or []) == before
    with keras.StatelessScope():
        pass


@pytest.mark.backends
def test_layout_map_is_jax_only():
    import keras

    import keras_vit
    from keras_vit.train import layouts

    model = keras_vit.vit(32, 8, 64, 1, 4, 128, 10)
    mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"),
                                         devices=["cpu:0"])
    backend = keras.backend.backend()
    if backend == "jax":
        lm = layouts.layout_map(model, mesh)
        assert lm["encoder_block_0/attention/out/kernel"].axes == (
            "model", None, None)
        assert lm["encoder_block_0/norm_1/gamma"] is None
        with pytest.raises(ValueError, match="has no axis named 'model'"):
            layouts.layout_map(model, keras.distribution.DeviceMesh(
                (1,), ("batch",), devices=["cpu:0"]))
        return
    for call in (lambda: layouts.layout_map(model, mesh),
                 lambda: layouts.distribution(1)):
        with pytest.raises(layouts.StrategyError) as e:
            call()
        assert f"the backend is {backend!r}" in str(e.value)
        assert "KERAS_BACKEND=jax" in str(e.value)


@pytest.mark.backends
def test_docstring_examples():
    import doctest

    from keras_vit.train import layouts

    result = doctest.testmod(layouts, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 8


# -- two simulated devices (a JAX child process) ---------------------------

STEPS = 8
BATCH = 32
TINY = (16, 4, 32, 2, 2, 64, 10)  # image, patch, width, layers, heads, mlp
# Measured here: the curves agree to 1e-7 (the reductions differ only in
# order); the tolerance leaves room for another XLA version.
LOSS_TOL = 1e-5
PRED_TOL = 1e-5


def _child():
    """Fits the same tiny ViT from the same weights on one device, under
    DataParallel and under ModelParallel over two devices; prints JSON."""
    import keras
    import numpy as np

    import keras_vit
    import keras_vit.train as kt
    from keras_vit.train import layouts

    source = kt.digits("train")
    n = STEPS * BATCH
    digits = np.asarray(source.images)[:n].reshape(n, 8, 8)
    x = digits.repeat(2, 1).repeat(2, 2)[..., None].repeat(3, -1) / 8 - 1
    y = np.asarray(source.labels())[:n]
    keras.utils.set_random_seed(0)
    start = [np.asarray(w) for w in keras_vit.vit(*TINY).get_weights()]

    class Losses(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.seen = []

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append(float(logs["loss"]))

    def run(distribution):
        keras.distribution.set_distribution(distribution)
        try:
            model = keras_vit.vit(*TINY)
            model.set_weights(start)
            kt.compile_for_finetune(model, total_steps=STEPS,
                                    warmup_steps=1, batch_size=BATCH,
                                    learning_rate=0.1)
            losses = Losses()
            model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                      verbose=0, callbacks=[losses])
            pred = model.predict(x[:BATCH], verbose=0)
            layout = {}
            for v in model.weights:
                sharding = v.value.sharding
                layout[v.path] = {
                    "spec": [a for a in getattr(sharding, "spec", ())],
                    "devices": len(sharding.device_set),
                    "shard": list(sharding.shard_shape(v.value.shape)),
                    "shape": list(v.value.shape)}
            return {"losses": losses.seen, "pred": pred.tolist(),
                    "layout": layout}
        finally:
            keras.distribution.set_distribution(None)

    out = {"devices": keras.distribution.list_devices()}
    out["one"] = run(None)
    out["data"] = run(layouts.distribution(2))
    out["model"] = run(layouts.distribution(
        2, model_parallel=2, model=keras_vit.vit(*TINY)))
    errors = []
    for kwargs in (dict(model_parallel=2, model="ViT-Ti/16"),
                   dict(model_parallel=3, model="ViT-B/16"),
                   dict(model_parallel=2), dict(devices=4)):
        try:
            layouts.distribution(**dict(dict(devices=2), **kwargs))
        except ValueError as e:
            errors.append(str(e))
    out["errors"] = errors
    print("RESULT " + json.dumps(out))


@pytest.mark.slow
def test_two_devices_data_and_model_parallel_match_one_device():
    # Here, not at the top: the child runs this file as a script.
    from conftest import two_jax_cpu_devices_flags

    env = dict(os.environ, KERAS_BACKEND="jax", KERAS_VIT_OFFLINE="1",
               XLA_FLAGS=two_jax_cpu_devices_flags(),
               TF_CPP_MIN_LOG_LEVEL="3")
    t = time.time()
    proc = subprocess.run([sys.executable, __file__], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [line] = [s for s in proc.stdout.splitlines() if s.startswith("RESULT ")]
    out = json.loads(line[len("RESULT "):])
    print(f"child: {time.time() - t:.1f} s")
    import numpy as np

    assert out["devices"] == ["cpu:0", "cpu:1"]
    one = np.array(out["one"]["losses"])
    assert len(one) == STEPS
    # The head starts at zero (uniform 0.1); after training the predictions
    # differ between images, so matching them means matching the training.
    assert np.ptp(np.array(out["one"]["pred"]), axis=0).max() > 0.05
    assert np.ptp(one) > 0.01, one
    for kind in ("data", "model"):
        run = out[kind]
        np.testing.assert_allclose(run["losses"], one, atol=LOSS_TOL,
                                   err_msg=kind)
        np.testing.assert_allclose(run["pred"], out["one"]["pred"],
                                   atol=PRED_TOL, err_msg=kind)

    def layout(kind, path):
        return out[kind]["layout"][path]

    q = "encoder_block_1/attention/query/kernel"
    # DataParallel: every weight whole on both devices.
    assert layout("data", q)["devices"] == 2
    assert layout("data", q)["shard"] == layout("data", q)["shape"] == [
        32, 2, 16]
    # ModelParallel: one head of the query kernel per device, half the MLP.
    assert layout("model", q)["spec"] == [None, "model", None]
    assert layout("model", q)["shard"] == [32, 1, 16]
    mlp = layout("model", "encoder_block_0/mlp/dense_1/kernel")
    assert mlp["spec"] == ["model", None] and mlp["shard"] == [32, 32]
    norm = layout("model", "encoder_norm/gamma")
    assert norm["shard"] == norm["shape"] and norm["devices"] == 2
    split = [p for p, v in out["model"]["layout"].items()
             if v["shard"] != v["shape"]]
    # Per block q/k/v kernels and biases, out, MLP in (kernel, bias) and
    # out; then the patch embedding (kernel, bias) and the head.
    assert len(split) == 2 * 10 + 3, split

    heads, mesh, no_model, too_many = out["errors"]
    assert "model_parallel=2 does not divide num_heads=3" in heads
    assert "nearest that does is 1" in heads
    assert "model_parallel=3 does not divide devices=2" in mesh
    assert "needs model=" in no_model and "model_parallel=2" in no_model
    assert "devices=4 is more than the 2 devices" in too_many


if __name__ == "__main__":
    _child()
