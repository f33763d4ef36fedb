"""What TensorFlow's CPU graph makes of a ViT: fused nodes, counted.

Grappler's remapper fuses MatMul + BiasAdd + tanh GELU into one oneDNN
kernel only when the inputs of each Mul/AddV2 sort, by node name, into the
order of its pattern (keras_vit/runtime/fused_ops.py). Names depend on the model's
name, on nesting, on how many blocks there are and on what else is in the
graph, so these tests build models every way a user does and count the
fused nodes of the graph that actually ran (keras_vit.runtime.graph_ops).

float32 fusions exist wherever TensorFlow runs oneDNN (x86 Linux by
default); the bf16 tests need oneDNN's bf16 kernels on this CPU (AVX512F or
AVX-NE-CONVERT) and say so when they skip. No timing here: speed is
benchmarks/speed.py's and benchmarks/graph_ops.py's.
"""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.runtime import compat
from keras_vit.runtime import graph_ops
from keras_vit.runtime import hardware
from keras_vit.zoo.resolve import rebuild

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="grappler's graphs are TensorFlow's own")


def _needs_onednn():
    if not compat.onednn_enabled():
        pytest.skip("this TensorFlow runs without oneDNN "
                    "(TF_ENABLE_ONEDNN_OPTS=0 or a non-x86 build)")


def _needs_onednn_bf16():
    _needs_onednn()
    if not compat.onednn_supports("bfloat16"):
        pytest.skip("oneDNN has no bf16 kernels on this CPU (needs AVX512F "
                    "or AVX-NE-CONVERT); the float32 tests still run")


def _tiny(layers=2, **kwargs):
    return keras_vit.vit(32, 8, 32, layers, 2, 64, 3, **kwargs)


def _summary(model, **kwargs):
    return graph_ops.fusion_summary(graph_ops.op_counts(model, **kwargs))


@pytest.mark.parametrize("name", [
    None, "A", "zzzzzzzzzz", "0vit", "my.model", "Vision_Transformer_9"])
def test_one_fused_gelu_per_block_under_any_model_name(name):
    _needs_onednn()
    model = _tiny(3, **({"name": name} if name else {}))
    s = _summary(model)
    assert s["matmul_bias_gelu"] == 3, s
    # Every other matmul has its bias fused; none is left bare.
    assert s["matmul_unfused"] == 0, s
    assert s["tanh"] == 0, s


@pytest.mark.parametrize("layers", [1, 2, 5, 12])
def test_fusion_holds_at_every_depth(layers):
    _needs_onednn()
    s = _summary(_tiny(layers))
    assert s["matmul_bias_gelu"] == layers, s


def test_two_models_in_one_graph_and_a_nested_model():
    _needs_onednn()
    import tensorflow as tf

    a, b = _tiny(2, name="zeta"), _tiny(3, name="alpha")
    x = tf.constant(np.zeros((2, 32, 32, 3), "float32"))
    both = tf.function(lambda x: a(x, training=False) + b(x, training=False))
    graphs = compat.tf_executed_graphs(lambda: both(x))
    labels = [graph_ops.node_label(n) for g in graphs for n in g.node]
    assert labels.count("_MklNativeFusedMatMul[BiasAdd,GeluApproximate]") \
        == 5

    inputs = keras.Input((32, 32, 3))
    outer = keras.Model(inputs, keras.layers.Activation("softmax")(
        _tiny(4, name="inner")(inputs)), name="outer")
    assert _summary(outer)["matmul_bias_gelu"] == 4


def test_fusion_survives_rebuild_and_keras_save(tmp_path):
    _needs_onednn()
    model = _tiny(2, name="original")
    copy = rebuild(model, num_classes=5)
    assert _summary(copy)["matmul_bias_gelu"] == 2
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert _summary(loaded)["matmul_bias_gelu"] == 2


def test_hybrid_and_axial_blocks_fuse_too():
    _needs_onednn()
    hybrid = keras_vit.vit(64, 1, 32, 2, 2, 64, 3,
                           resnet=dict(num_layers=(1, 1), width_factor=1),
                           name="hybrid")
    assert _summary(hybrid)["matmul_bias_gelu"] == 2
    # An axial block is two encoder blocks, one along rows, one along
    # columns: two fused MLPs each.
    axial = keras_vit.axial_vit(32, 8, 32, 2, 2, 64, 3)
    assert _summary(axial)["matmul_bias_gelu"] == 4


def test_fused_float32_logits_equal_the_unfused_ops():
    """The fused kernel computes the package's tanh GELU: the graph that
    ran fused and the same ops run one by one agree to float32 rounding."""
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    model = keras_vit.vit(64, 16, 96, 3, 3, 384, 10)
    rng = np.random.default_rng(0)
    for w in model.weights:  # a head that is not zero, larger activations
        w.assign(rng.normal(0, 0.1, w.shape).astype("float32"))
    x = rng.uniform(-1, 1, (4, 64, 64, 3)).astype("float32")
    fused = tf.function(lambda x: model(x, training=False))(x).numpy()
    eager = model(x, training=False).numpy()
    scale = np.abs(eager).max()
    assert scale > 0.1
    np.testing.assert_allclose(fused, eager, atol=1e-6 * max(1.0, scale))


def test_training_step_takes_bias_gradients_from_bias_add_grad():
    _needs_onednn()
    import keras_vit.train as kt

    layers = 2
    model = _tiny(layers)
    kt.compile_for_finetune(model, total_steps=4, warmup_steps=1,
                            batch_size=4, jit_compile=False)
    counts = graph_ops.op_counts(model, batch_size=4, training=True)
    s = graph_ops.fusion_summary(counts)
    # q, k, v, out and the two MLP denses of every block, and the head.
    assert s["bias_add_grad"] >= 6 * layers + 1, s
    if hardware.plan("float32").elementwise == "xla":
        # The two LayerNorms, the softmax and the GELU of every block, each
        # forward and backward, as calls XLA must compile; none of their
        # element-wise ops is left in the graph.
        assert s["xla_programs"] == 8 * layers, counts
        assert s["tanh"] == 0 and s["layer_norm"] == 0, s
        assert counts["TanhGrad"] == 0 and counts["Rsqrt"] <= 1, counts
    else:
        # The GELU's backward is the custom one: one TanhGrad per block.
        assert s["tanh"] == layers and counts["TanhGrad"] == layers, counts


def test_training_gelu_gradient_equals_autodiff_of_the_formula():
    import tensorflow as tf

    from keras_vit.runtime import fused_ops
    from keras_vit.layers import gelu_tanh

    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(0, 2, (64, 16)).astype("float32"))
    k = tf.constant(rng.normal(0, 0.5, (16, 32)).astype("float32"))
    b = tf.constant(rng.normal(0, 0.5, (32,)).astype("float32"))
    dy = tf.constant(rng.normal(0, 1, (64, 32)).astype("float32"))

    def grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([x, k, b])
            y = fn()
        return [g.numpy() for g in tape.gradient(y, [x, k, b], dy)]

    lean = grads(lambda: fused_ops.dense_gelu_tanh_for_training(x, k, b))
    ref = grads(lambda: gelu_tanh(tf.matmul(x, k) + b))
    for got, want in zip(lean, ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_op_counts_checks_its_arguments():
    model = _tiny(1)
    with pytest.raises(ValueError, match="batch_size"):
        graph_ops.op_counts(model, batch_size=0)
    with pytest.raises(ValueError, match="compile the model first"):
        graph_ops.op_counts(model, training=True)


def _cast_fed_softmax(nodes):
    """Softmax nodes whose input comes from, or output goes to, a Cast."""
    by_name = {n.name: n for n in nodes}
    softmax = [n for n in nodes if "Softmax" in n.op and "Grad" not in n.op]
    bad = 0
    for n in softmax:
        src = by_name.get(n.input[0].split(":")[0].lstrip("^"))
        if src is not None and src.op == "Cast":
            bad += 1
    for n in nodes:
        if n.op == "Cast" and any(i.split(":")[0] in {s.name for s in softmax}
                                  for i in n.input):
            bad += 1
    return bad, len(softmax)


def test_bf16_graph_fuses_gelu_and_keeps_softmax_in_bf16(monkeypatch):
    _needs_onednn_bf16()
    # The plan that runs bf16 through TensorFlow's graph (AMX, or a probe
    # that found oneDNN's bf16 faster than float32).
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx512f,amx_bf16,amx_tile")
    assert hardware.plan("bfloat16").softmax == "input"
    layers = 3
    model = _tiny(layers, dtype="bfloat16", name="bf16_model")
    nodes = graph_ops.executed_nodes(model)
    s = graph_ops.fusion_summary(graph_ops.op_counts(model))
    assert s["matmul_bias_gelu"] == layers, s
    cast_fed, softmax = _cast_fed_softmax(nodes)
    assert softmax == layers and cast_fed == 0
    # What casts remain are LayerNorm's float32 statistics (input up,
    # output down, and gamma/beta stored in bf16) and the input image.
    norms = 2 * layers + 1
    assert s["cast"] <= 4 * norms + 2, s


def test_bf16_softmax_keeps_its_float32_round_trip_where_xla_runs_it(
        monkeypatch):
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx2")
    assert hardware.plan("bfloat16").predict == "xla"
    assert hardware.plan("bfloat16").softmax == "float32"


def test_bf16_plan_follows_the_probe(monkeypatch):
    """Without AMX, bf16 takes the graph path when oneDNN's bf16 matmul
    measured faster than float32 here, else XLA."""
    monkeypatch.delenv("KERAS_VIT_CPU_FLAGS", raising=False)
    monkeypatch.setattr(hardware, "detect", lambda: hardware.Hardware(
        "cpu", frozenset({"avx512f", "avx512_bf16"})))
    monkeypatch.setattr(hardware, "_onednn_bf16", lambda hw, probed: True)
    monkeypatch.setattr(hardware, "bf16_matmul_speedup", lambda: 2.0)
    fast = hardware.plan("bfloat16")
    assert (fast.predict, fast.train_jit, fast.softmax) == (
        "graph", False, "input")
    assert "2.00x" in fast.reason
    monkeypatch.setattr(hardware, "bf16_matmul_speedup", lambda: 0.8)
    assert hardware.plan("bfloat16").predict == "xla"
    # A machine passed in is judged by its flags, never probed.
    monkeypatch.setattr(hardware, "bf16_matmul_speedup", lambda: 1 / 0)
    zen = hardware.Hardware("cpu", frozenset({"avx512f", "avx512_bf16"}))
    assert hardware.plan("bfloat16", zen).predict == "xla"


def test_the_probe_measures_something():
    speedup = hardware.bf16_matmul_speedup()
    assert isinstance(speedup, float) and 0.01 < speedup < 100


def test_fused_spelling_equals_keras_gelu_inside_a_graph():
    import tensorflow as tf

    from keras_vit.runtime import fused_ops

    rng = np.random.default_rng(1)
    x, k, b = (tf.constant(rng.normal(0, 1, s).astype("float32"))
               for s in ((16, 24), (24, 40), (40,)))
    fused = tf.function(fused_ops.dense_gelu_tanh)(x, k, b).numpy()
    plain = tf.function(lambda x, k, b: keras.ops.gelu(
        tf.matmul(x, k) + b, approximate=True))(x, k, b).numpy()
    np.testing.assert_allclose(fused, plain, atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_training_graph_has_no_cast_round_trips(precision):
    """No cast pairs that cancel in the training step (each pair is time
    spent for nothing in every bf16 step). The one Keras itself writes
    (its sparse cross-entropy casts integer labels to float and back) is
    not the model's."""
    import keras_vit.train as kt

    model = _tiny(2, dtype=precision)
    kt.compile_for_finetune(model, total_steps=4, warmup_steps=1,
                            batch_size=4, jit_compile=False)
    nodes = graph_ops.executed_nodes(model, batch_size=4, training=True)
    trips = [pair for pair in graph_ops.cast_round_trips(nodes)
             if "compile_loss" not in pair[0]]
    assert trips == [], trips
    # The check itself finds a round trip when there is one.
    import tensorflow as tf

    fn = tf.function(lambda x: tf.cast(tf.cast(x, tf.float32), tf.bfloat16))
    graph = fn.get_concrete_function(
        tf.TensorSpec((2,), tf.bfloat16)).graph.as_graph_def()
    assert len(graph_ops.cast_round_trips(list(graph.node))) == 1


def test_the_graph_ops_script_prints_one_row_per_dtype_and_job(capsys):
    """benchmarks/graph_ops.py, run in this process on a small zoo model:
    a row per (dtype, job) with the fused counts and the cast round trips."""
    import importlib.util
    import pathlib

    _needs_onednn()
    root = pathlib.Path(__file__).resolve().parents[2]
    path = root / "benchmarks" / "graph_ops.py"
    spec = importlib.util.spec_from_file_location("graph_ops_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--model", "ViT-Ti/16", "--image-size", "32",
                 "--dtypes", "float32", "--jobs", "infer,train",
                 "--batch-size", "1"])
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("| dtype"))
    keys = [c.strip() for c in header.strip("|").split("|")]
    assert keys[-1] == "cast_round_trips"
    rows = {tuple(c.strip() for c in line.strip("|").split("|"))[:2]:
            dict(zip(keys, (c.strip() for c in line.strip("|").split("|"))))
            for line in lines if line.startswith("| float32")}
    assert set(rows) == {("float32", "infer"), ("float32", "train")}
    assert rows[("float32", "infer")]["matmul_bias_gelu"] == "12"
    assert rows[("float32", "infer")]["cast_round_trips"] == "0"
    assert int(rows[("float32", "train")]["bias_add_grad"]) >= 73
