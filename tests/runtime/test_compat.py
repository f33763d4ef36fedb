"""Each wrapper of keras_vit/runtime/compat.py, called against the installed Keras,
tf2onnx and LiteRT: an upgrade that removes a private API keras-vit uses
fails here, with a message naming that API."""

import types

import keras
import numpy as np
import pytest

from keras_vit.runtime import compat


def _call(wrapper, *args, **kwargs):
    # A PrivateAPIError already names the API; fail with its message alone.
    try:
        return wrapper(*args, **kwargs)
    except compat.PrivateAPIError as e:
        pytest.fail(str(e), pytrace=False)


def _tiny():
    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(3, name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))


def test_a_missing_private_api_is_named():
    with pytest.raises(compat.PrivateAPIError,
                       match=r"Functional._run_through_graph is gone from "
                             r"keras \d"):
        compat.run_through_graph(types.SimpleNamespace(), None, None)


def test_flatten_layers():
    model = _tiny()
    names = [layer.name for layer in _call(compat.flatten_layers, model)]
    assert names[0] == model.name and names[-2:] == ["hidden", "out"]
    assert [layer.name for layer in _call(
        compat.flatten_layers, model, include_self=False)][-2:] == [
            "hidden", "out"]


def test_current_remat_mode():
    assert _call(compat.current_remat_mode) is None
    with keras.RematScope(mode="full"):
        assert _call(compat.current_remat_mode) == "full"
    assert _call(compat.current_remat_mode) is None


def test_stateless_scope():
    assert _call(compat.stateless_scope) is None
    with keras.StatelessScope() as scope:
        assert _call(compat.stateless_scope) is scope


def test_run_through_graph():
    model = _tiny()
    seen = []

    def call(layer, *args, **kwargs):
        seen.append(layer.name)
        out = layer(*args, **kwargs)
        return out * 0 if layer.name == "hidden" else out

    x = np.ones((1, 4), "float32")
    out = _call(compat.run_through_graph, model, x, call)
    assert seen == ["hidden", "out"]
    # The hidden layer's output was replaced: only the bias is left.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out),
                               np.zeros((1, 2)), atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="Keras' TensorFlow trainer")
def test_repair_multi_worker_fit_leaves_other_strategies_to_keras():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    assert _call(compat.repair_multi_worker_fit) is True
    assert compat.repair_multi_worker_fit() is True  # once is enough
    repaired = trainer.reduce_per_replica
    # Outside multi-worker mode the repair hands over to Keras' own code.
    value = tf.constant([1.0, 3.0])
    strategy = tf.distribute.get_strategy()
    np.testing.assert_array_equal(repaired(value, strategy, "auto"), value)


def test_ema_once_per_step_averages_on_update_calls_only():
    v = keras.Variable(np.zeros(1, "float32"), name="w")
    optimizer = keras.optimizers.SGD(1.0, use_ema=True, ema_momentum=0.5,
                                     gradient_accumulation_steps=2)
    _call(compat.ema_once_per_step, optimizer)
    optimizer.build([v])
    average = optimizer._model_variables_moving_average[0]
    seen = []
    for _ in range(4):  # two optimizer steps of two micro-batches
        optimizer.apply([keras.ops.convert_to_tensor([-1.0])], [v])
        seen.append((float(keras.ops.convert_to_numpy(v)[0]),
                     float(keras.ops.convert_to_numpy(average)[0])))
    # The weight moves 1 per step; the average copies it on the first step,
    # then moves halfway once per step, not at every micro-batch.
    assert seen == [(0.0, 0.0), (1.0, 1.0), (1.0, 1.0), (2.0, 1.5)]
    plain = keras.optimizers.SGD(1.0, use_ema=True)
    assert compat.ema_once_per_step(plain) is plain


def test_forget_deferred_variables():
    from keras.src.backend.common import global_state

    with keras.StatelessScope(initialize_variables=False):
        variable = keras.Variable(initializer="zeros", shape=(3,),
                                  name="deferred")
    pending = global_state.get_global_attribute("uninitialized_variables")
    assert any(v is variable for v in pending)
    _call(compat.forget_deferred_variables, [variable])
    pending = global_state.get_global_attribute(
        "uninitialized_variables") or []
    assert all(v is not variable for v in pending)


def test_quantization_modes():
    modes = _call(compat.quantization_modes, ("int8",))
    assert {"int8", "int4", "float8"} <= set(modes)


def test_should_quantize_layer():
    model = _tiny()
    hidden = model.get_layer("hidden")
    assert _call(compat.should_quantize_layer, hidden, None) is True
    assert _call(compat.should_quantize_layer, hidden, "^out$") is False


def test_patch_numpy_product():
    had = hasattr(np, "product")
    _call(compat.patch_numpy_product)
    try:
        assert np.product([2, 3]) == 6
    finally:
        if not had:  # the patch is for the converter's child process only
            del np.product


def test_tf2onnx_tensor_data():
    from tf2onnx import graph
    storage = graph.ExternalTensorStorage()
    assert _call(compat.tf2onnx_tensor_data, storage) == {}
    assert compat.tf2onnx_tensor_data(None) is None


def test_tflite_ops_details(tmp_path):
    import tensorflow as tf
    import ai_edge_litert.interpreter as interpreter_lib

    @tf.function(input_signature=[tf.TensorSpec((1, 4), tf.float32)])
    def double(x):
        return tf.nn.relu(x * 2.0)

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [double.get_concrete_function()], double)
    path = tmp_path / "double.tflite"
    path.write_bytes(converter.convert())
    interpreter = interpreter_lib.Interpreter(model_path=str(path))
    ops = _call(compat.tflite_ops_details, interpreter)
    assert ops and {"op_name", "inputs", "outputs"} <= set(ops[0])
