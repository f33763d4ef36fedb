"""benchmarks/step_profile.py: which profiled events count as matmuls,
as other ops, or not at all (a function call's event holds its ops)."""

import importlib.util
import os

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks", "step_profile.py")


def _module():
    spec = importlib.util.spec_from_file_location("step_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, kind", [
    # Event names seen in TensorFlow 2.21's CPU profile of a ViT step.
    ("gradient_tape/vit/encoder_block_0/mlp/dense_1/MatMul:_MklMatMul",
     "matmul"),
    ("vit/encoder_block_0/mlp/dense_0/MatMul:_MklNativeFusedMatMul",
     "matmul"),
    ("gradient_tape/vit/patch_embedding/Conv2DBackpropFilter:"
     "_MklNativeConv2DBackpropFilterWithBias", "matmul"),
    ("vit/encoder_block_3/attention/einsum/Einsum:_MklBatchMatMulV2",
     "matmul"),
    ("gradient_tape/vit/head/BiasAdd/BiasAddGrad:BiasAddGrad", "other"),
    ("SGD/update/ResourceApplyKerasMomentum:ResourceApplyKerasMomentum",
     "other"),
    ("StatefulPartitionedCall: __inference_one_step_on_data_16335", None),
    ("ExecutorState::Process", None),
    ("CpuExecutable::ExecuteAsyncOnStream", "xla"),
])
def test_profiled_events_are_sorted_by_what_they_run(name, kind):
    assert _module().op_kind(name) == kind
