"""The serving graph every format exports: named outputs, an optional uint8
input with the preprocessing inside, and a float32 copy of low-precision
models; written as a SavedModel that tracks each variable once.
"""

from __future__ import annotations

import numpy as np

from keras_vit.base.checks import check_pair
from keras_vit.data.naflex import PATCH_INPUTS
from keras_vit.data.normalization import (
    config_value, of_model, takes_raw_pixels)
from keras_vit.export import samples
from keras_vit.runtime.backend import no_grad, to_numpy
from keras_vit.runtime.policy import dtype_policy_scope

from keras_vit.export.common import (  # noqa: F401 (OUTPUTS: the names)
    BLOCK_OUTPUT, OUTPUTS, check_outputs)
INPUT_NAME = "images"
_LOW_PRECISION = ("bfloat16", "float16")
_BATCH_HINT = "lower the batch sizes (batch_sizes=, --batch-sizes, --batch)"


def low_precision_dtype(model):
    """The bf16/fp16 compute or variable dtype of ``model``, or None."""
    for layer in [model] + list(model.layers):
        for attr in ("compute_dtype", "variable_dtype"):
            value = str(getattr(layer, attr, None) or "")
            if value in _LOW_PRECISION:
                return value
    for weight in model.weights:
        if str(weight.dtype) in _LOW_PRECISION:
            return str(weight.dtype)
    return None


def float32_copy(model):
    """A float32 copy of a bf16/fp16 (or mixed-precision) model with the
    same weights.

    >>> import keras, keras_vit
    >>> keras.config.set_dtype_policy("mixed_bfloat16")
    >>> m = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> keras.config.set_dtype_policy("float32")
    >>> low_precision_dtype(m), low_precision_dtype(float32_copy(m))
    ('bfloat16', None)
    """
    import keras

    from keras_vit.models import ResNetV2, VisionTransformer
    from keras_vit.zoo import rebuild

    if isinstance(model, (VisionTransformer, ResNetV2)):
        return rebuild(model, dtype="float32")
    # Each layer's own dtype set to float32: a global mixed policy would
    # otherwise leak into the copy's layers.
    with dtype_policy_scope("float32"):
        def as_float32(layer):
            config = layer.get_config()
            if "dtype" in config:
                config["dtype"] = "float32"
            return layer.__class__.from_config(config)

        try:
            copy = keras.models.clone_model(model,
                                            clone_function=as_float32)
        except Exception as e:  # noqa: BLE001 - reported with the reason
            raise ValueError(
                f"cannot make a float32 copy of model={model.name!r} "
                f"({type(model).__name__}): {e}. Rebuild it in float32 "
                "and load its weights, or pass cast_to_float32=False "
                "(SavedModel only)") from e
    copy.set_weights([np.asarray(w, dtype=np.float32)
                      for w in model.get_weights()])
    return copy


def _with_attention_scores(model):
    """``model`` rebuilt to also return its attention maps."""
    from keras_vit.models import VisionTransformer
    from keras_vit.zoo import rebuild

    if getattr(model, "return_attention_scores", False):
        return model
    if not isinstance(model, VisionTransformer):
        raise ValueError(
            "outputs 'attention_maps' needs a keras_vit VisionTransformer; "
            f"model={model.name!r} is a {type(model).__name__}")
    return rebuild(model, return_attention_scores=True)


def default_outputs(model):
    """The outputs an export of ``model`` returns unless told otherwise:
    a classifier's ``logits`` and ``probabilities``; a feature
    extractor's ``pre_logits``, or ``features`` where it has no pooled one
    or its head is a projection (CLIP's towers).

    >>> import keras_vit
    >>> kw = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
    ...           num_heads=1, mlp_dim=8)
    >>> default_outputs(keras_vit.vit(**kw, num_classes=3))
    ('logits', 'probabilities')
    >>> default_outputs(keras_vit.vit(**kw, num_classes=0))
    ('pre_logits',)
    """
    from keras_vit.models.features import available_features, is_classifier

    if is_classifier(model):
        return (("logits", "probabilities")
                if probabilities_inside(model) is not None else ("logits",))
    if getattr(model, "head_type", None) == "projection":
        return ("features",)  # the head's output is the embedding
    return (("pre_logits",) if "pre_logits" in available_features(model)
            else ("features",))


def probabilities_inside(model):
    """Whether a classifier's own output is already probabilities (True:
    its ``classifier_activation`` is softmax or sigmoid) or logits that
    an export passes through a softmax (False: none); None for another
    activation, whose outputs are neither."""
    from keras_vit.zoo.preprocessing import head_activation

    activation = head_activation(model) or "linear"
    if activation == "linear":
        return False
    return True if activation in ("softmax", "sigmoid") else None


def check_head(model, outputs, what="outputs"):
    """Refuses class scores from a model without a classification head,
    and probabilities from a head whose activation gives none."""
    from keras_vit.models.features import is_classifier, why_features

    scores = [o for o in outputs if o in ("logits", "probabilities",
                                          "scores")]
    if scores and not is_classifier(model):
        raise ValueError(
            f"outputs {scores[0]!r} needs a classification head; model="
            f"{model.name!r} is a feature extractor ("
            f"{why_features(model)}), whose embedding is outputs="
            f"{default_outputs(model)!r}")
    probabilities = [o for o in scores if o != "logits"]
    if probabilities and probabilities_inside(model) is None:
        raise ValueError(
            f"{what} {probabilities[0]!r}: probabilities, the softmax of a "
            "head's logits or the head's own softmax or sigmoid; model="
            f"{model.name!r} has classifier_activation="
            f"{model.classifier_activation!r}, whose outputs are neither: "
            "export its own output as outputs=('logits',) (input='images')")


def _output_tensor(model, name):
    """The symbolic tensor of output ``name`` in ``model``'s graph."""
    from keras_vit.models.features import (
        available_features, encoder_depth, feature_tensor,
        intermediate_tensors, model_output)

    available = available_features(model)
    if name == "logits":
        check_head(model, (name,))
        return feature_tensor(model, "logits")
    if name == "pre_logits":
        if "pre_logits" not in available:
            raise ValueError(
                f"outputs 'pre_logits' needs a pooled representation; "
                f"model={model.name!r} has no 'pre_logits' or 'pooling' "
                "layer")
        return feature_tensor(model, "pre_logits")
    if name == "attention_maps":
        return feature_tensor(model, "attention_scores")
    block = BLOCK_OUTPUT.fullmatch(name)
    if block:
        index, depth = int(block.group(1)), encoder_depth(model)
        if not -depth <= index < depth:
            raise ValueError(
                f"outputs {name!r} names no block of model={model.name!r}: "
                + (f"it has {depth}, block_0 to block_{depth - 1} (or "
                   f"block_-1 to block_-{depth} from the end)" if depth
                   else "it has no encoder blocks (a ViT's outputs)"))
        return next(iter(intermediate_tensors(model, [index]).values()))
    if name == "features":
        if isinstance(model.output, dict) and "output" not in model.output:
            raise ValueError(
                f"outputs 'features' is ambiguous for model="
                f"{model.name!r}, whose outputs are {sorted(model.output)}")
        return model_output(model)
    raise AssertionError(name)  # names were checked by the caller


def _built_size(model):
    """The (height, width) a dynamic-size model was built for."""
    return check_pair("image_size", model.get_config()["image_size"])


def _other_sizes(model, built):
    """Two sizes besides ``built`` at which a dynamic-size export is
    verified: one larger, one not square, each a multiple of the model's
    stride."""
    from keras_vit.layers.image_sizes import image_sizes

    stride = image_sizes(model).multiple
    height, width = built

    def fit(side):
        return max(stride, int(round(side / stride)) * stride)

    return ((fit(height * 1.5), fit(width * 1.5)),
            (fit(height * 0.5), fit(width * 1.5)))


def _patch_size(model):
    """A NaFlex model's patch side (square: patchify cuts squares)."""
    return int(model.get_config()["patch_size"])


def _patch_counts(model):
    """The patch counts a NaFlex export is verified at: its position
    table's, then one larger and one smaller, so that an artifact that
    froze N fails."""
    rows, cols = _built_size(model)
    patch = _patch_size(model)
    table = max(1, (rows // patch) * (cols // patch))
    return table, (table + table // 2 + 1, max(1, table // 2))


def _mixed_grids(n, max_patches, rng):
    """``n`` (rows, cols) grids of at most ``max_patches`` patches: the
    first near-square, the others random, so that a batch holds padding."""
    rows = max(1, int(max_patches ** 0.5))
    grids = [(rows, max_patches // rows)]
    while len(grids) < n:
        rows = int(rng.integers(1, max_patches + 1))
        grids.append((rows, int(rng.integers(1, max_patches // rows + 1))))
    return grids[:n]


class ServingGraph:
    """What an export serves, built from a Keras model.

    Args:
        model: a built Keras model taking (batch, H, W, C) images, or a
            NaFlex model taking the dict of :data:`PATCH_INPUTS`.
        outputs: names from OUTPUTS, in the order of the artifact's outputs
            (None: :func:`default_outputs`): ``logits`` (the model's own
            output: a distilled model's mean of its two heads, after its
            ``classifier_activation`` if any), ``probabilities`` (softmax
            of the logits, in float32; the model's own output where its
            ``classifier_activation`` is softmax or sigmoid), ``pre_logits``,
            ``attention_maps`` (ViT only: (batch, layers, heads, N, N)),
            ``features`` (the model's own output), ``block_<i>`` (ViT
            only: encoder block ``i``'s (batch, h, w, D) patch map).
        uint8_input: the artifact takes uint8 pixels and normalises them
            inside as the model says, unless the model does it itself.
        cast_to_float32: export a float32 copy of a bf16/fp16 model.
        allow_low_precision: whether the format can hold a low-precision
            graph when ``cast_to_float32`` is False.
    """

    def __init__(self, model, outputs=None, uint8_input=False, cast_to_float32=True,
                 allow_low_precision=False):
        import keras

        if not isinstance(model, keras.Model):
            raise ValueError(f"model must be a keras.Model; received "
                             f"model={type(model).__name__}")
        outputs = check_outputs(default_outputs(model) if outputs is None
                                else outputs)
        check_head(model, outputs)
        self.naflex = bool(getattr(model, "naflex", False))
        if self.naflex:
            if uint8_input:
                raise ValueError(
                    f"uint8_input=True does not apply to model={model.name!r}"
                    ", which takes NaFlex patches (naflex=True) as float32: "
                    "cut the images with keras_vit.data.naflex.patchify "
                    "(normalised, or pixels for include_preprocessing=True) "
                    "and pass uint8_input=False")
            block = next((o for o in outputs if BLOCK_OUTPUT.fullmatch(o)),
                         None)
            if block is not None:
                raise ValueError(
                    f"outputs {block!r} maps one grid of patches (batch, h, "
                    f"w, D); model={model.name!r} takes NaFlex patches "
                    "(naflex=True), each image a grid of its own: export a "
                    "fixed-size copy for block maps, keras_vit.rebuild("
                    "model, naflex=False, image_size=...)")
            if sorted(model.input) != sorted(PATCH_INPUTS):
                raise ValueError(
                    f"model={model.name!r} (naflex=True) must take the "
                    f"inputs {list(PATCH_INPUTS)}; it takes "
                    f"{sorted(model.input)}")
        elif len(model.inputs or ()) != 1:
            raise ValueError(
                f"model={model.name!r} must take one input (images); it takes "
                f"{len(model.inputs or ())}")
        shape = tuple(model.inputs[0].shape)
        if self.naflex:
            width = int(model.input["patches"].shape[-1])
            shape = (None, None, None, width // _patch_size(model) ** 2)
        self.dynamic_size = bool(
            getattr(model, "dynamic_image_size", False)
            and len(shape) == 4 and shape[1] is None and shape[2] is None
            and shape[3] is not None)
        if len(shape) != 4 or (None in shape[1:] and not (
                self.dynamic_size or self.naflex)):
            raise ValueError(
                f"model={model.name!r} takes inputs of shape {shape}; export "
                "needs fixed-size images (batch, height, width, channels) "
                "or a model built with dynamic_image_size=True")
        self.notes = []
        self._args = {"outputs": list(outputs),
                      "uint8_input": bool(uint8_input),
                      "cast_to_float32": bool(cast_to_float32),
                      "allow_low_precision": bool(allow_low_precision)}
        self.source_model = model
        self.source_dtype = low_precision_dtype(model)
        if self.source_dtype is not None:
            if cast_to_float32:
                model = float32_copy(model)
                self.notes.append(
                    f"the model computes in {self.source_dtype}; exported a "
                    "float32 copy with the same weights (the TFLite and ONNX "
                    "converters do not handle bf16 graphs)")
            elif not allow_low_precision:
                raise ValueError(
                    f"model={model.name!r} computes in {self.source_dtype}, "
                    "which this format cannot hold (the TFLite and ONNX "
                    "converters do not handle bf16 graphs); pass "
                    "cast_to_float32=True to export a float32 copy")
        if "attention_maps" in outputs:
            model = _with_attention_scores(model)
        self.model = model
        self.outputs = outputs
        self.input_shape = (tuple(_built_size(model)) + shape[3:]
                            if self.dynamic_size or self.naflex
                            else shape[1:])
        self.extra_image_sizes = (_other_sizes(model, self.input_shape[:2])
                                  if self.dynamic_size else ())
        self.patch_count, self.extra_patch_counts = (
            _patch_counts(model) if self.naflex else (None, ()))
        self.uint8_input = bool(uint8_input)
        self.input_dtype = "uint8" if uint8_input else "float32"
        includes_preprocessing = takes_raw_pixels(model)
        self.scale_inside = self.uint8_input and not includes_preprocessing
        self.normalization = of_model(model)
        self.own_probabilities = probabilities_inside(model)
        self.value_range = (samples.PIXELS if (uint8_input
                                              or includes_preprocessing)
                            else samples.UNIT)
        needed = [o for o in outputs if o != "probabilities"]
        if "probabilities" in outputs and "logits" not in needed:
            needed.append("logits")
        self.raw = keras.Model(
            model.input if self.naflex else model.inputs[0],
            {n: _output_tensor(model, n) for n in needed},
            name=f"{model.name}_export")
        self._function = None

    def _model_inputs(self, images):
        """The artifact's inputs -> the model's (``keras.ops``)."""
        import keras

        if self.naflex:
            x = {name: images[name] for name in PATCH_INPUTS}
        else:
            # Shape arithmetic too: some converters drop assertions.
            x = self.image_sizes().check_images(images)
        if self.uint8_input:
            x = keras.ops.cast(x, "float32")
            if self.scale_inside:
                x = self.normalization(x)
        return x

    def _named(self, raw):
        """The artifact's outputs, in float32, from :attr:`raw`'s."""
        import keras

        out = {}
        for name in self.outputs:
            value = keras.ops.cast(raw["logits" if name == "probabilities"
                                       else name], "float32")
            if name == "probabilities" and not self.own_probabilities:
                value = keras.ops.softmax(value, axis=-1)
            out[name] = value
        return out

    def serve(self, images):
        """The serving computation in ``keras.ops``: images -> dict."""
        return self._named(self.raw(self._model_inputs(images),
                                    training=False))

    def keras_outputs(self, x):
        """:attr:`raw`'s outputs for the model inputs ``x``; those that are
        the model's own output (``logits``, ``features``) from its own
        call, not from the serving graph."""
        own = [n for n in ("logits", "features") if n in self.raw.output]
        out = ({} if len(own) == len(self.raw.output)
               else dict(self.raw(x, training=False)))
        if own:
            value = self.model(x, training=False)
            if isinstance(value, dict):
                value = value["output"]
            out.update(dict.fromkeys(own, value))
        return out

    def image_sizes(self):
        """The model's :class:`~keras_vit.layers.image_sizes.ImageSizes`."""
        from keras_vit.layers.image_sizes import image_sizes

        if self.naflex:  # patches of any grid: no image size to check
            return None
        return image_sizes(self.source_model)

    def refused_image_sizes(self):
        """Image (height, width) pairs the model refuses."""
        sizes = self.image_sizes()
        return () if sizes is None else sizes.refused_examples()

    def input_spec(self):
        import tensorflow as tf

        shape = ((None, None, None) + tuple(self.input_shape[2:])
                 if self.dynamic_size else (None,) + tuple(self.input_shape))
        return tf.TensorSpec(shape, tf.as_dtype(self.input_dtype),
                             name=INPUT_NAME)

    def input_specs(self):
        """The artifact's inputs: :meth:`input_spec`, or a NaFlex model's
        :data:`PATCH_INPUTS` (batch and patch count free)."""
        if not self.naflex:
            return [self.input_spec()]
        import tensorflow as tf

        width = int(self.raw.input["patches"].shape[-1])
        return [tf.TensorSpec((None, None, width), tf.float32,
                              name="patches"),
                tf.TensorSpec((None, None, 2), tf.int32,
                              name="patch_coords"),
                tf.TensorSpec((None, None), tf.int32, name="patch_mask")]

    def function(self):
        """A ``tf.function`` of :meth:`serve` with a batch-dynamic input
        signature."""
        if self._function is None:
            import tensorflow as tf

            if self.naflex:
                def serving_default(patches, patch_coords, patch_mask):
                    return self.serve({"patches": patches,
                                       "patch_coords": patch_coords,
                                       "patch_mask": patch_mask})
            else:
                def serving_default(images):
                    return self.serve(images)

            self._function = tf.function(
                serving_default, input_signature=self.input_specs(),
                autograph=False)
        return self._function

    def save(self, directory):
        """Writes a SavedModel with the ``serving_default`` signature.

        The root tracks the captured variables, not the Keras model: with
        the model attached, the TFLite converter keeps every variable as an
        uninitialised resource (NaN outputs; TF 2.21). It holds the concrete
        function: saving a ``tf.function`` traces it again.
        """
        import tensorflow as tf

        concrete = self.function().get_concrete_function()
        root = tf.Module()
        root.serving_default = concrete
        root.model_variables = list(concrete.variables)
        tf.saved_model.save(root, directory,
                            signatures={"serving_default": concrete})

    def reference(self, images, batch_size=8):
        """Keras' answers for ``images``, eagerly on the user's backend:
        the model's own call (:meth:`keras_outputs`), named as
        :meth:`serve` names them."""
        parts = []
        with no_grad():
            for start in range(0, samples.count(images), batch_size):
                x = self._model_inputs(
                    samples.rows(images, start, start + batch_size))
                parts.append(to_numpy(self._named(self.keras_outputs(x))))
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def source_logits(self, images):
        """The original (e.g. bf16) model's logits/features for a batch."""
        import keras

        x = images
        if self.uint8_input:
            x = x.astype(np.float32)
            if self.scale_inside:
                x = self.normalization(x).astype(np.float32)
        name = "logits" if "logits" in self.raw.output else next(
            iter(self.raw.output))
        source = self.source_model
        if name in ("logits", "pre_logits", "attention_maps"):
            try:
                source = keras.Model(
                    source.input if self.naflex else source.inputs[0],
                    _output_tensor(source, name))
            except (ValueError, KeyError):
                return None, None
        with no_grad():
            out = source(x, training=False)
            if isinstance(out, dict):
                out = out.get("output", next(iter(out.values())))
            return name, to_numpy(keras.ops.cast(out, "float32"))

    def describe(self):
        """The input and outputs, for the report."""
        out_shapes = {}
        for name in self.outputs:
            key = "logits" if name == "probabilities" else name
            shape = tuple(self.raw.output[key].shape)
            out_shapes[name] = [None] + [None if d is None else int(d)
                                         for d in shape[1:]]
        if self.naflex:
            specs = self.input_specs()
            inputs = {"names": list(PATCH_INPUTS),
                      "shapes": {s.name: list(s.shape) for s in specs},
                      "dtypes": {s.name: s.dtype.name for s in specs},
                      "patch_size": _patch_size(self.source_model)}
        else:
            inputs = {"name": INPUT_NAME,
                      "shape": ([None, None, None, int(self.input_shape[2])]
                                if self.dynamic_size else
                                [None] + [int(d) for d in self.input_shape]),
                      "dtype": self.input_dtype}
        inputs.update(range=self.input_range(),
                      preprocessing_inside=self.value_range == samples.PIXELS,
                      normalization=self.normalization.to_config())
        return {"input": inputs, "outputs": out_shapes}

    def class_names(self):
        """``(source, names)``: the classes of the artifact's ``logits`` and
        ``probabilities``; ``(None, None)`` when the model names none or
        the artifact returns no class scores."""
        if not {"logits", "probabilities"} & set(self.outputs):
            return None, None
        from keras_vit.zoo.preprocessing import model_labels

        count = int(self.raw.output["logits"].shape[-1])
        source, rows = model_labels(self.source_model, count, by_head=False)
        if rows is None:
            return None, None
        return source, [str(name) for _, name in rows]

    def rebuild_args(self):
        """The arguments that rebuild this graph from :attr:`model`."""
        return dict(self._args)

    def weights_bytes(self):
        return int(sum(np.prod(w.shape) * np.dtype(str(w.dtype)).itemsize
                       for w in self.model.weights))

    def sample_images(self, n, seed=0, kind="noise", image_size=None,
                      max_patches=None):
        """``(inputs, note)``: deterministic inputs in the artifact's range,
        ``"noise"`` (uniform) or ``"photos"`` (crops of sample photos), at
        ``image_size`` (default: the model's); a NaFlex model's:
        :meth:`sample_patches`."""
        if self.naflex:
            return self.sample_patches(n, seed, kind, max_patches)
        return self._pixel_images(n, seed, kind, image_size)

    def _pixel_images(self, n, seed, kind, image_size):
        from keras_vit.models.memory import check_input_batch

        shape = (tuple(self.input_shape) if image_size is None else
                 tuple(image_size) + tuple(self.input_shape[2:]))
        check_input_batch(n, shape, hint=_BATCH_HINT)
        if kind == "photos":
            pixels, note = samples.photo_images(shape, n, seed)
            return samples.to_input_range(pixels, self.input_dtype,
                                         self.value_range,
                                         self.normalization), note
        if self.value_range == samples.PIXELS:
            images = samples.noise_images(shape, n, self.input_dtype,
                                          samples.PIXELS, seed)
        else:  # uniform pixels as the model's inputs ([-1, 1]: uniform)
            images = self.normalization(samples.noise_images(
                shape, n, "float32", samples.PIXELS, seed)).astype(
                    self.input_dtype)
        return images, (f"{n} uniform random images in {self.input_range()}"
                        f" (seed {seed})")

    def sample_patches(self, n, seed=0, kind="noise", max_patches=None):
        """``(inputs, note)``: ``n`` images of mixed grids cut by
        :func:`keras_vit.data.naflex.patchify` (``resize=False``) and
        padded to ``max_patches`` patches each."""
        from keras_vit.data import naflex
        from keras_vit.models.memory import check_input_batch

        count = int(max_patches or self.patch_count)
        patch = _patch_size(self.source_model)
        channels = int(self.input_shape[-1])
        check_input_batch(n, (count, patch * patch * channels),
                          hint=_BATCH_HINT)
        rng = np.random.default_rng(seed)
        images = [self._pixel_images(
            1, seed * 1000 + i, kind, (rows * patch, cols * patch))[0][0]
            for i, (rows, cols) in enumerate(_mixed_grids(n, count, rng))]
        what = ("uniform random images" if kind == "noise"
                else "crops of the sample photos")
        return naflex.patchify(images, patch, max_patches=count,
                               resize=False), (
            f"{n} {what} of mixed grids in {self.input_range()}, "
            f"{count} patches each with padding (seed {seed})")

    def input_range(self):
        """The artifact's input range in words."""
        if (self.value_range == samples.PIXELS
                or config_value(self.normalization) is None):
            return self.value_range
        ends = [np.asarray(self.normalization(np.float32(v)))
                for v in (0.0, 255.0)]
        return (f"[{float(np.min(ends)):.4g}, {float(np.max(ends)):.4g}]")
