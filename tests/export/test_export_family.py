"""The ViT family's options through every export: a tiny model of each
group (registers without a class token, the attention-pool head, q/k
norms, layer scale, no biases, pre-norm, the gated MLP, RMSNorm and the
patch norm; DeiT's distilled heads; BEiT's, Qwen's, DINOv3's, EVA-02's,
RoPE-ViT's, AIMv2's, Gemma 4's and DeepSeek's options, differential
attention in parallel blocks, the conv stem, SAM's windows, decomposed
relative positions and neck, timm's relative position MLP and ResNet-D
stem; the groups that can share a model share one) becomes a SavedModel,
an ONNX file, a TFLite file and an OpenVINO IR (the options model also a
SavedModel with the image-bytes signature and a full-int8 TFLite file
whose RMSNorm stays float), each run in its own runtime and compared
with Keras by the exporter (it raises when they differ). A runtime that
cannot run the converted file is one line naming the file, and nothing
is written."""

import os

import numpy as np
import pytest

from keras_vit.models.vit import VisionTransformer
from testkit import FAMILY_OPTIONS

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=2,
            num_heads=2, mlp_dim=16, num_classes=3)
MODELS = {
    # SigLIP-like: registers lead the sequence (no class token before
    # them), pooled by the attention-pool head.
    "pooled": FAMILY_OPTIONS,
    # DINOv3-like: its rotary form alone (no table) at another
    # temperature, layer scale, any image size; DeiT's distilled heads
    # (the quick GELU). Stochastic depth is training's: the exported
    # graphs leave it out. Two branches a block (timm's
    # ParallelThingsBlock).
    "dinov3": dict(rope="dinov3", position_embedding="none",
                   layer_scale=0.5, rope_temperature=1000.0,
                   dynamic_image_size=True, distilled=True, gelu="quick",
                   fc_norm=False, drop_path_rate=0.1, branches=2),
    # RoPE-ViT's learned mixed frequencies; Perception Encoder's xy
    # indexing and pool heads (over the class token too) in AIMv2's
    # attention pool; BEiT's relative bias table per block, post-norm
    # blocks, layer scale.
    "mixed": dict(rope="mixed", rope_offset=1.0, rope_indexing="xy",
                  classifier="map", class_token=True, pool_heads=1,
                  pool_prefix=True, pool_form="aimv2",
                  relative_bias="block", post_norm=True, layer_scale=0.5),
    # Qwen-like: EVA-02's rotary coordinates with the halves turned, the
    # patch merger, any image size (the table resized as timm does);
    # DeepSeek's RMSNorm, a bias-free SwiGLU beside biased attention, the
    # final norm and a scale-free one after the pooling.
    "merged": dict(class_token=False, classifier="gap", rope="eva02",
                   rope_halves=True, merge_size=2, merge_width=5,
                   dynamic_image_size=True, position_resize="bicubic_aa",
                   norm="rms", mlp="swiglu", mlp_bias=False,
                   pooled_norm=True),
    # timm's vit_dpwee-like: differential attention in parallel blocks
    # (one output bias), a register, layer scale, q/k norms; MobileCLIP's
    # conv stem (its BatchNorms at their statistics); timm's
    # relative-position ViT's shared relative position MLP (no pairs with
    # the class token or the register); EVA-02's CLIP projection head on
    # DINOv2's classifier pooling (the class token beside the patches'
    # mean, twice the width).
    "dpwee": dict(differential="vectors", parallel="fused",
                  class_token=True, num_registers=1,
                  classifier="token_gap", head_type="projection",
                  layer_scale=0.5, qk_norm=True, conv_stem=True,
                  relative_mlp="shared", relative_mlp_width=6),
    # SAM-like: windows of 2 over a 3 x 3 grid (padded), a global block,
    # the decomposed relative tables, the convolutional neck.
    "sam": dict(image_size=24, class_token=False, classifier="gap",
                final_norm=False, window_size=2, global_blocks=[1],
                decomposed_bias=True, neck=4, layer_norm_epsilon=1e-5),
    # Gemma 4's tower: four RMS norms a block, q/k/v norms, GeGLU without
    # biases, the table per axis and the 2D rotary form; over timm's
    # ResNet-D hybrid stem: a ViT over the 1 x 1 patches of a deep stem,
    # BatchNorm bottlenecks and average-pooled shortcuts.
    "gemma": dict(position_embedding="none", class_token=False,
                  classifier="gap", final_norm=True, fc_norm=True,
                  norm="rms", sandwich_norm=True, value_norm=True,
                  qk_norm=True, qkv_bias=False, proj_bias=False,
                  mlp="geglu", position_axes=5, rope="eva02",
                  rope_halves=True, rope_indexing="xy", clip_linears=True,
                  soft_pool=2, soft_pool_standardize=True,
                  image_size=32, patch_size=1,
                  resnet=dict(num_layers=[1, 1], variant="d")),
}


# Rows exported by tests of their own: the NaFlex inputs are no image
# batch (tests/export/test_export_naflex.py).
EXPORTED_ELSEWHERE = ("naflex", "position_aspect")


def test_every_option_row_is_on_in_some_exported_model():
    """A row added to the option table is exported here once it is on in
    one of the models (or named in EXPORTED_ELSEWHERE)."""
    from keras_vit.base import options

    off = [row.name for row in options.OPTIONS
           if row.name not in EXPORTED_ELSEWHERE and not any(
               model.get(row.name, row.default) != row.default
               for model in MODELS.values())]
    assert not off, off


def _model(name):
    model = VisionTransformer(**dict(TINY, **MODELS[name]))
    rng = np.random.default_rng(0)
    for w in model.weights:
        value = rng.normal(0, 0.5, w.shape)
        if w.path.endswith("moving_variance"):  # a variance: positive
            value = np.abs(value) + 0.5
        if w.path.endswith("/clip"):  # clamp bounds: [min, max] twice
            value = (np.abs(value) + 0.5) * np.array([-1, 1, -1, 1])
        w.assign(value.astype("float32"))
    return model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_format_runs_the_family_model_as_keras_does(name, tmp_path):
    from keras_vit.export import (to_onnx, to_openvino, to_saved_model,
                                  to_tflite)

    model = _model(name)
    for export, path in ((to_saved_model, "saved_model"),
                         (to_onnx, "model.onnx"),
                         (to_tflite, "model.tflite")):
        report = export(model, str(tmp_path / path))
        assert os.path.exists(tmp_path / path), path
        assert report["verification"]["passed"], (path, report)
    report = to_openvino(model, str(tmp_path / "model.xml"))
    assert report["verified"] is True, report
    if name != "pooled":
        return
    # The serving signature that decodes image files.
    report = to_saved_model(model, str(tmp_path / "bytes"),
                            input="image_bytes")
    assert report["input"]["name"] == "image_bytes"
    assert report["verification"]["passed"], report
    # Full int8: RMSNorm becomes SQUARE, MEAN, ADD, RSQRT and MULs; its
    # statistics stay float (SQUARE has no int8 kernel; MEAN and RSQRT
    # are in the default float_ops, as LayerNorm's), its scaling MULs are
    # int8 as LayerNorm's are. Relative RMS error of the logits, this
    # model drawn from seeds 0-2: 0.019-0.107 (norm="layer": 0.011-0.026);
    # about the same with the MULs float, and with every op but the int8
    # FULLY_CONNECTEDs float: the projections' error, not the norm's.
    report = to_tflite(model, str(tmp_path / "int8.tflite"),
                       quantization="int8", representative_samples=8,
                       agreement_samples=8,
                       tolerance={"top1_agreement": 0.6})
    assert report["verification"]["passed"], report
    dtypes = report["options"]["op_dtypes"]
    for op in ("SQUARE", "MEAN", "RSQRT"):
        assert dtypes[op] == ["float32"], (op, dtypes)
    assert "int8" in dtypes["FULLY_CONNECTED"], dtypes


def test_a_runtime_that_cannot_run_the_file_is_one_line(tmp_path,
                                                        monkeypatch):
    from keras_vit.export import tflite
    from keras_vit.export import ExportError, to_tflite

    def refuses(path, *args, **kwargs):
        raise RuntimeError("XNNPack delegate failed to reshape runtime\n"
                           "Node number 28 (RESHAPE) failed to prepare.")

    monkeypatch.setattr(tflite, "open_artifact", refuses)
    path = tmp_path / "model.tflite"
    with pytest.raises(ExportError) as e:
        to_tflite(_model("merged"), str(path))
    message = str(e.value)
    assert "\n" not in message and str(path) in message
    assert "did not run in its runtime (RuntimeError: XNNPack" in message
    assert not path.exists()
