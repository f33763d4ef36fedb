"""The encoder block and its MLP, token pooling, and the ResNet units of the hybrid stem
and BiT; rematerialisation of a block's training call."""

from __future__ import annotations

import keras
from keras import layers, ops

from keras_vit.base.geometry import mlp_first_width
from keras_vit.runtime import compat
from keras_vit.runtime.backend import is_jax
from keras_vit.layers.registered import PACKAGE
from keras_vit.layers.dense import (
    FusedDense, KeptArguments, MLP_GELU, XAVIER, bias_init, check_gelu,
    check_mlp, check_norm, clamp, gated, make_norm, unbounded,
    with_arguments)
from keras_vit.layers.attention import MultiHeadSelfAttention, ReturnsScores


def rematerialized(layer, forward, *tensors):
    """``forward(*tensors)``, rematerialised (``keras.remat``), for
    ``layer``'s training call. Every tensor to differentiate goes in
    ``tensors``, positionally: TensorFlow's recompute_grad gives keyword
    arguments no gradient.

    The recomputation would draw new dropout masks (gradients off by 9 on
    TensorFlow, 0.26 on torch, silently): the seed generators' states are
    restored at the start of each run of ``forward``. On JAX, where no
    state may change inside the checkpointed function, they go in and
    come out as values.
    """
    generators = [sub.seed_generator for sub in
                  compat.flatten_layers(layer, include_self=False)
                  if getattr(sub, "seed_generator", None) is not None]
    states = [ops.copy(g.state.value) for g in generators]
    if not is_jax() or not generators:
        def run(*args):
            for generator, state in zip(generators, states):
                generator.state.assign(state)
            return forward(*args)

        return keras.remat(run)(*tensors)

    outer = compat.stateless_scope()

    def run_stateless(seeds, *args):
        with keras.StatelessScope() as scope:
            if outer is not None:  # the weights as the step sees them
                scope.state_mapping.update(outer.state_mapping)
            for generator, seed in zip(generators, seeds):
                scope.state_mapping[id(generator.state)] = seed
            out = forward(*args)
            advanced = [scope.get_current_value(g.state) for g in generators]
        return out, advanced

    out, advanced = keras.remat(run_stateless)(states, *tensors)
    for generator, state in zip(generators, advanced):
        generator.state.assign(state)
    return out


def window_partition(x, grid, window):
    """The tokens ``x`` (B, rows * cols, D) of a ``grid`` map as its
    ``window`` x ``window`` windows (B * windows, window ** 2, D), row by
    row of windows, each row-major; the map padded with zeros at its
    bottom and right to a multiple of ``window`` (ViTDet's and SAM's)."""
    rows, cols = grid
    pad_r, pad_c = -rows % window, -cols % window
    dim = int(x.shape[-1])
    x = ops.reshape(x, (-1, rows, cols, dim))
    if pad_r or pad_c:
        x = ops.pad(x, ((0, 0), (0, pad_r), (0, pad_c), (0, 0)))
    across = (cols + pad_c) // window
    # [b, i, a, j, c] -> [b, i, j, a, c] with four axes: (a) and (j, c).
    x = ops.reshape(x, (-1, window, across, window * dim))
    x = ops.transpose(x, (0, 2, 1, 3))
    return ops.reshape(x, (-1, window * window, dim))


def window_merge(windows, grid, window):
    """:func:`window_partition` undone: the windows back on the map, the
    padding cut off, as tokens (B, rows * cols, D)."""
    rows, cols = grid
    padded = (rows + -rows % window, cols + -cols % window)
    dim = int(windows.shape[-1])
    x = ops.reshape(windows, (-1, padded[1] // window, window, window * dim))
    x = ops.transpose(x, (0, 2, 1, 3))
    x = ops.reshape(x, (-1, padded[0], padded[1], dim))
    if padded != (rows, cols):
        x = x[:, :rows, :cols]
    return ops.reshape(x, (-1, rows * cols, dim))


def check_remat(remat):
    """``remat`` if it is True or False, else a ValueError naming it."""
    if not isinstance(remat, bool):
        raise ValueError(f"remat must be True or False; received "
                         f"remat={remat!r}")
    return remat


@keras.saving.register_keras_serializable(package=PACKAGE)
class DropPath(layers.Layer):
    """Stochastic depth (Huang et al. 2016): in training, each example's
    residual branch is dropped with probability ``rate`` and the kept ones
    are scaled by 1 / (1 - rate); outside training the identity."""

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)
        if not 0 <= self.rate < 1:
            raise ValueError(f"rate must be in [0, 1); received "
                             f"rate={rate!r}")
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=None):
        if training is not True or self.rate == 0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = keras.random.uniform(shape, seed=self.seed_generator) < keep
        return x * ops.cast(mask, x.dtype) / ops.cast(keep, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return with_arguments(super().get_config(), self, ("rate", "seed"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class MlpBlock(KeptArguments, layers.Layer):
    """Dense -> GELU (``gelu``: "tanh", "exact" or "quick") -> Dropout ->
    Dense -> Dropout; ``use_bias=False`` drops both Dense biases.
    ``kind="swiglu"``/``"geglu"`` gates instead (:func:`gated`) from a
    first Dense ``2 * mlp_dim`` wide. ``norm`` (of ``norm_epsilon``)
    normalises the hidden features (EVA-02's ``scale_mlp``).
    ``output_bias``: the second Dense's bias where it differs from
    ``use_bias``. ``clip``: each projection clamps its input and output
    (non-trainable weight ``clip``: rows [input min, input max, output
    min, output max], Gemma 4's E2B/E4B tower's)."""

    ARGUMENTS = {"mlp_dim": int, "dropout_rate": float, "gelu": check_gelu,
                 "use_bias": bool, "kind": check_mlp,
                 "norm": lambda kind: None if kind is None else check_norm(
                     kind), "norm_epsilon": float,
                 "output_bias": lambda v: None if v is None else bool(v),
                 "clip": bool}

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu="tanh", use_bias=True,
                 kind="gelu", norm=None, norm_epsilon=1e-6, output_bias=None,
                 clip=False, **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())
        self.dropout = layers.Dropout(self.dropout_rate,
                                      dtype=self.dtype_policy)
        self.hidden_norm = (None if self.norm is None else make_norm(
            self.norm, self.norm_epsilon, self.dtype_policy, "norm"))

    def build(self, input_shape):
        dim = int(input_shape[-1])
        self.dense_0 = FusedDense(
            mlp_first_width(self.mlp_dim, self.kind),
            gelu=self.gelu if self.kind == "gelu" and not self.clip
            else None, use_bias=self.use_bias, kernel_initializer=XAVIER,
            bias_initializer=bias_init(), dtype=self.dtype_policy,
            name="dense_0")
        self.dense_1 = FusedDense(
            dim, use_bias=self.use_bias if self.output_bias is None
            else self.output_bias, kernel_initializer=XAVIER,
            bias_initializer=bias_init(), dtype=self.dtype_policy,
            name="dense_1")
        self.dense_0.build((None, dim))
        self.dense_1.build((None, self.mlp_dim))
        if self.hidden_norm is not None:
            self.hidden_norm.build((None, self.mlp_dim))
        if self.clip:
            self.clip_bounds = self.add_weight(
                name="clip", shape=(2 + (self.kind != "gelu"), 4),
                initializer=unbounded, trainable=False)
        self.built = True

    def _first(self, x, training):
        """The first Dense of the (clamped) tokens, its output clamped; a
        gated MLP's halves each from its own input bounds."""
        if not self.clip:
            return self.dense_0(x, training=training)
        bounds = ops.cast(self.clip_bounds, "float32")
        if self.kind == "gelu":
            return MLP_GELU[self.gelu](clamp(self.dense_0(
                clamp(x, bounds[0, :2]), training=training), bounds[0, 2:]))
        halves = [self.dense_0(clamp(x, bounds[n, :2]), training=training)
                  for n in (0, 1)]
        m = self.mlp_dim
        return ops.concatenate(
            [clamp(halves[0][:, :m], bounds[0, 2:]),
             clamp(halves[1][:, m:], bounds[1, 2:])], axis=-1)

    def call(self, x, training=None):
        shape = ops.shape(x)
        h = self._first(ops.reshape(x, (-1, shape[-1])), training)
        if self.kind != "gelu":
            h = gated(h, ops.silu if self.kind == "swiglu"
                      else MLP_GELU[self.gelu])
        h = self.dropout(h, training=training)
        if self.hidden_norm is not None:
            h = self.hidden_norm(h)
        if self.clip:
            last = ops.cast(self.clip_bounds[-1], "float32")
            h = clamp(self.dense_1(clamp(h, last[:2]), training=training),
                      last[2:])
        else:
            h = self.dense_1(h, training=training)
        h = ops.reshape(h, shape)
        return self.dropout(h, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class EncoderBlock(ReturnsScores, layers.Layer):
    """Pre-LN Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

    ``remat=True`` rematerialises the block in training: only its input is
    kept for the backward pass, for about one more forward pass of compute;
    the numbers are the same.

    The other arguments are the ViT family's block options (their rows in
    :mod:`keras_vit.base.options`), passed on to
    :class:`MultiHeadSelfAttention` and :class:`MlpBlock` where they
    belong; ``layer_scale`` makes weights ``layer_scale_1`` and
    ``layer_scale_2``, ``sandwich_norm`` layers ``post_norm_1`` and
    ``post_norm_2``, ``branches`` (n > 1) layers ``branch_{b}_*``.
    """

    def __init__(self, num_heads, mlp_dim, dropout_rate=0.0,
                 attention_dropout_rate=0.0, layer_norm_epsilon=1e-6,
                 gelu="tanh", remat=False, layer_scale=None, qk_norm=False,
                 qkv_bias=True, proj_bias=True, drop_path_rate=0.0,
                 mlp="gelu", norm="layer", mlp_norm=False,
                 attention_norm=False, rope=None, rope_halves=None,
                 post_norm=False, sandwich_norm=False, value_norm=False,
                 clip_linears=False, mlp_bias=None, differential=None,
                 parallel=None, branches=1, index=0, window_size=0,
                 decomposed_bias=False, grid_size=None, **kwargs):
        super().__init__(**kwargs)
        self.window_size = int(window_size)
        self.decomposed_bias = bool(decomposed_bias)
        self.grid_size = None if grid_size is None else [
            int(s) for s in grid_size]
        if self.grid_size is None and (self.window_size
                                       or self.decomposed_bias):
            raise ValueError(
                "window_size and decomposed_bias read the patches as a map: "
                "they need the block's grid_size (rows, cols); received "
                f"window_size={self.window_size}, decomposed_bias="
                f"{self.decomposed_bias}, grid_size=None")
        self.differential = differential
        self.parallel = parallel
        self.index = int(index)
        self.rope_halves = rope_halves
        self.post_norm = bool(post_norm)
        self.sandwich_norm = bool(sandwich_norm)
        self.value_norm = bool(value_norm)
        self.clip_linears = bool(clip_linears)
        self.mlp_bias = None if mlp_bias is None else bool(mlp_bias)
        self.mlp_norm = bool(mlp_norm)
        self.attention_norm = bool(attention_norm)
        self.rope = rope
        self.remat = check_remat(remat)
        self.mlp_kind = check_mlp(mlp)
        self.norm = check_norm(norm)
        self.layer_scale = (None if layer_scale is None
                            else float(layer_scale))
        self.qk_norm = bool(qk_norm)
        self.qkv_bias = bool(qkv_bias)
        self.proj_bias = bool(proj_bias)
        self.drop_path_rate = float(drop_path_rate)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.gelu = check_gelu(gelu)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

        def norm(name):
            return make_norm(self.norm, self.layer_norm_epsilon,
                             self.dtype_policy, name)

        def attention(name):
            return MultiHeadSelfAttention(
                self.num_heads, self.attention_dropout_rate,
                qkv_bias=self.qkv_bias, proj_bias=self.proj_bias,
                qk_norm=self.qk_norm, norm_epsilon=self.layer_norm_epsilon,
                norm=self.norm, rope=self.rope, rope_halves=self.rope_halves,
                output_norm=self.attention_norm, value_norm=self.value_norm,
                clip=self.clip_linears,
                differential=self.differential, index=self.index,
                decomposed=(None if not self.decomposed_bias
                            else [self.window_size] * 2 if self.window_size
                            else self.grid_size),
                dtype=self.dtype_policy, name=name)

        # A parallel block's MLP: the first bias always, the second shared
        # with the attention's where the output projections are fused.
        def mlp(name):
            return MlpBlock(
                self.mlp_dim, self.dropout_rate, self.gelu,
                use_bias=(self.proj_bias if self.mlp_bias is None
                          else self.mlp_bias) or bool(self.parallel),
                kind=self.mlp_kind,
                norm=self.norm if self.mlp_norm else None,
                norm_epsilon=self.layer_norm_epsilon,
                output_bias=self.proj_bias and (
                    self.parallel != "fused") if self.parallel else None,
                clip=self.clip_linears, dtype=self.dtype_policy, name=name)

        self.norm_1 = norm("norm_1")
        self.attention = attention("attention")
        self.dropout = layers.Dropout(self.dropout_rate,
                                      dtype=self.dtype_policy)
        self.norm_2 = None if self.parallel else norm("norm_2")
        self.post_norm_1, self.post_norm_2 = (
            norm(f"post_norm_{n}") if self.sandwich_norm else None
            for n in (1, 2))
        self.mlp = mlp("mlp")
        self.branches = int(branches)
        self.other_branches = [
            (norm(f"branch_{b}_norm_1"), attention(f"branch_{b}_attention"),
             norm(f"branch_{b}_norm_2"), mlp(f"branch_{b}_mlp"))
            for b in range(1, self.branches)]
        # Only with a rate: a seed generator is state a .keras file keeps.
        self.drop_path = (DropPath(self.drop_path_rate,
                                   dtype=self.dtype_policy, name="drop_path")
                          if self.drop_path_rate else None)

    def build(self, input_shape):
        for sub in (self.norm_1, self.attention, self.norm_2, self.mlp,
                    self.post_norm_1, self.post_norm_2):
            if sub is not None:
                sub.build((None, self.window_size ** 2, input_shape[-1])
                          if sub is self.attention and self.window_size
                          else input_shape)
        for sub in (sub for group in self.other_branches for sub in group):
            sub.build(input_shape)
        self.branch_scales = []
        if self.layer_scale is not None:
            dim = int(input_shape[-1])
            init = keras.initializers.Constant(self.layer_scale)
            self.layer_scale_1 = self.add_weight(
                name="layer_scale_1", shape=(dim,), initializer=init)
            if not self.parallel:
                self.layer_scale_2 = self.add_weight(
                    name="layer_scale_2", shape=(dim,), initializer=init)
            self.branch_scales = [
                tuple(self.add_weight(name=f"branch_{b}_layer_scale_{n}",
                                      shape=(dim,), initializer=init)
                      for n in (1, 2)) for b in range(1, self.branches)]
        self.built = True

    def _branch(self, y, scale, training):
        """A residual branch's output as the block adds it: scaled by the
        layer scale, dropped by stochastic depth."""
        if scale is not None:
            y = y * ops.cast(scale, y.dtype)
        if self.drop_path is not None:
            y = self.drop_path(y, training=training)
        return y

    def call(self, x, training=None, return_attention_scores=False,
             **position):
        """``position``: the position scheme's tensors for the attention
        (:class:`MultiHeadSelfAttention`'s ``relative_embedding``, a 1D
        relative table whose logits join the scores; ``rope``, the rotary
        table of the queries and keys), passed to it as they are."""
        if self.remat and training is True and not return_attention_scores:
            return self._rematerialized(x, position)
        return self._forward(x, training, return_attention_scores,
                             **position)

    def _rematerialized(self, x, position):
        names = sorted(position)
        return rematerialized(
            self, lambda x, *tables: self._forward(
                x, True, **dict(zip(names, tables))),
            x, *(position[name] for name in names))

    def _forward(self, x, training=None, return_attention_scores=False,
                 **position):
        pre = (None, None) if self.post_norm else (self.norm_1, self.norm_2)
        post = ((self.norm_1, self.norm_2) if self.post_norm else
                (self.post_norm_1, self.post_norm_2))

        def norm(layer, y):
            return y if layer is None else layer(y)

        if self.branches > 1:
            return self._branched(x, training, return_attention_scores,
                                  position)
        h = norm(pre[0], x)
        window = self.window_size
        y = self.attention(
            window_partition(h, self.grid_size, window) if window else h,
            training=training,
            return_attention_scores=return_attention_scores, **position)
        if return_attention_scores:
            y, scores = y
        if window:
            y = window_merge(y, self.grid_size, window)
        scales = ((self.layer_scale_1, getattr(self, "layer_scale_2", None))
                  if self.layer_scale is not None else (None, None))
        if self.parallel:  # both branches read norm_1(x); one sum added
            y = self.dropout(y, training=training) + self.mlp(
                h, training=training)
            x = x + self._branch(y, scales[0], training)
            return (x, scores) if return_attention_scores else x
        x = x + self._branch(norm(post[0], self.dropout(
            y, training=training)), scales[0], training)
        x = x + self._branch(norm(post[1], self.mlp(
            norm(pre[1], x), training=training)), scales[1], training)
        return (x, scores) if return_attention_scores else x

    def _branched(self, x, training, return_attention_scores, position):
        """x + the sum of every branch's attention of its norm of x, then
        the same for the MLPs (timm's ParallelThingsBlock); the scores:
        every branch's heads, the first branch's first."""
        scales = ((self.layer_scale_1, self.layer_scale_2)
                  if self.layer_scale is not None else (None, None))
        groups = [(self.norm_1, self.attention, self.norm_2, self.mlp,
                   scales)]
        groups += [(*group, self.branch_scales[b] if self.branch_scales
                    else (None, None))
                   for b, group in enumerate(self.other_branches)]
        outputs, scores = [], []
        for norm_1, attention, _, _, (scale, _) in groups:
            y = attention(norm_1(x), training=training,
                          return_attention_scores=return_attention_scores,
                          **position)
            if return_attention_scores:
                y, found = y
                scores.append(found)
            outputs.append(self._branch(self.dropout(y, training=training),
                                        scale, training))
        x = x + _summed(outputs)
        x = x + _summed([self._branch(mlp(norm_2(x), training=training),
                                      scale, training)
                         for _, _, norm_2, mlp, (_, scale) in groups])
        return ((x, ops.concatenate(scores, axis=1))
                if return_attention_scores else x)

    def get_config(self):
        config = with_arguments(super().get_config(), self, (
            "num_heads", "mlp_dim", "dropout_rate", "attention_dropout_rate",
            "layer_norm_epsilon", "gelu", "remat", "layer_scale", "qk_norm",
            "qkv_bias", "proj_bias", "drop_path_rate", "norm", "mlp_norm",
            "attention_norm", "rope", "rope_halves", "post_norm",
            "sandwich_norm", "value_norm", "clip_linears", "mlp_bias",
            "differential", "parallel", "branches", "index", "window_size",
            "decomposed_bias", "grid_size"))
        config["mlp"] = self.mlp_kind
        return config


def _summed(tensors):
    """The sum of ``tensors``, in their order (timm's stack, then sum)."""
    total = tensors[0]
    for tensor in tensors[1:]:
        total = total + tensor
    return total


POOLING_METHODS = ("token", "gap", "max", "avgmax", "token_gap")
"""How :class:`TokenPooling` pools: token 0 (the class token), or the
mean, the maximum, or the mean of the two over the patch tokens, or the
class token and the patches' mean side by side (twice the width)."""


def check_pooling_method(method):
    """``method`` if it is one of :data:`POOLING_METHODS`, else a
    ValueError naming it."""
    if method not in POOLING_METHODS:
        raise ValueError(
            f"method must be one of {', '.join(map(repr, POOLING_METHODS))}"
            f"; received method={method!r}")
    return method


@keras.saving.register_keras_serializable(package=PACKAGE)
class TokenPooling(KeptArguments, layers.Layer):
    """Pools a token sequence: ``"token"`` takes token ``index``; ``"gap"``
    the mean, ``"max"`` the maximum and ``"avgmax"`` (mean + max) / 2 of
    the tokens after the first ``num_prefix_tokens``; ``"token_gap"``
    token ``index`` and that mean concatenated, (B, 2D): DINOv2's linear
    classifier. ``padding_bias`` (a NaFlex batch's
    :class:`~keras_vit.models.positions.PaddingBias`) leaves padding out
    of the mean and the maximum; a row with no patch pools to zeros."""

    ARGUMENTS = {"method": check_pooling_method, "num_prefix_tokens": int,
                 "index": int}

    def __init__(self, method="token", num_prefix_tokens=0, index=0,
                 **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())

    def call(self, x, padding_bias=None):
        if self.method == "token":
            return x[:, self.index]
        token = x[:, self.index] if self.method == "token_gap" else None
        if self.num_prefix_tokens:
            x = x[:, self.num_prefix_tokens:]
        if padding_bias is None:
            mean, high = ops.mean(x, axis=1), ops.max(x, axis=1)
        else:
            # expand_dims, not [..., None]: TFLite has no kernel for a
            # strided slice that adds an axis to a tensor of unknown shape.
            bias = ops.cast(ops.expand_dims(
                padding_bias[:, 0, 0, self.num_prefix_tokens:], -1), x.dtype)
            kept = ops.cast(ops.equal(bias, 0), x.dtype)
            count = ops.sum(kept, axis=1)
            mean = ops.sum(x * kept, axis=1) / ops.maximum(count, 1.0)
            high = ops.where(count > 0, ops.max(x + bias, axis=1), 0.0)
        if self.method == "gap":
            return mean
        if self.method == "max":
            return high
        if self.method == "token_gap":
            return ops.concatenate([token, mean], axis=-1)
        return 0.5 * (mean + high)

    def compute_output_shape(self, input_shape):
        width = input_shape[-1]
        if self.method == "token_gap" and width is not None:
            width *= 2
        return (input_shape[0], width)


@keras.saving.register_keras_serializable(package=PACKAGE)
class StackScores(layers.Layer):
    """Stacks per-layer attention maps into (B, layers, heads, N, N)."""

    def call(self, scores):
        return ops.stack(list(scores), axis=1)

    def compute_output_shape(self, input_shape):
        first = input_shape[0]
        return (first[0], len(input_shape)) + tuple(first[1:])


@keras.saving.register_keras_serializable(package=PACKAGE)
class StdConv2D(layers.Conv2D):
    """Conv2D with weight standardisation (Qiao et al. 2019), as BiT uses:
    ``standardization="std"`` (vit_jax hybrids) is (w - mean) / (std +
    eps), ``"var"`` (big_transfer BiT) is (w - mean) / sqrt(var + eps).
    """

    def __init__(self, *args, standardization="var", eps=1e-10, **kwargs):
        super().__init__(*args, **kwargs)
        if standardization not in ("std", "var"):
            raise ValueError(
                "standardization must be 'std' or 'var'; received "
                f"standardization={standardization!r}")
        self.standardization = standardization
        self.eps = float(eps)

    def standardized_kernel(self, kernel):
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        centred = kernel - mean
        var = ops.mean(ops.square(centred), axis=(0, 1, 2), keepdims=True)
        if self.standardization == "std":
            return centred / (ops.sqrt(var) + self.eps)
        return centred / ops.sqrt(var + self.eps)

    def convolution_op(self, inputs, kernel):
        # Standardise in float32 even under mixed precision: the statistics
        # of a small kernel lose too much in bf16 (float64 stays float64).
        dtype = keras.backend.result_type(kernel.dtype, "float32")
        w = self.standardized_kernel(ops.cast(kernel, dtype))
        return super().convolution_op(inputs, ops.cast(w, inputs.dtype))

    def get_config(self):
        return with_arguments(super().get_config(), self,
                               ("standardization", "eps"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class ResidualUnit(layers.Layer):
    """Post-activation bottleneck unit of the hybrids' ResNet (vit_jax).

    conv1 1x1 -> GN -> ReLU -> conv2 3x3 (stride) -> GN -> ReLU -> conv3
    1x1 -> GN (zero scale), plus the shortcut (projection conv + GN when
    the shape changes), then ReLU: what the released hybrids computed,
    unlike BiT's pre-activation unit. ``standardization``/``std_eps``:
    :class:`StdConv2D`'s (timm's port runs ``"var"`` with 1e-8).
    """

    def __init__(self, features, strides=1, groups=32, epsilon=1e-6,
                 standardization="std", std_eps=1e-5, remat=False, **kwargs):
        super().__init__(**kwargs)
        self.remat = check_remat(remat)
        self.features = int(features)
        self.strides = int(strides)
        self.groups = int(groups)
        self.epsilon = float(epsilon)
        self.standardization = standardization
        self.std_eps = float(std_eps)

    def _conv(self, filters, size, strides, name):
        return StdConv2D(filters, size, strides=strides, padding="same",
                         use_bias=False, standardization=self.standardization,
                         eps=self.std_eps, kernel_initializer="lecun_normal",
                         dtype=self.dtype_policy, name=name)

    def _norm(self, name, zero=False):
        return layers.GroupNormalization(
            self.groups, epsilon=self.epsilon,
            gamma_initializer="zeros" if zero else "ones",
            dtype=self.dtype_policy, name=name)

    def build(self, input_shape):
        out = self.features * 4
        self.needs_projection = (input_shape[-1] != out or self.strides != 1)
        self.conv1 = self._conv(self.features, 1, 1, "conv1")
        self.gn1 = self._norm("gn1")
        self.conv2 = self._conv(self.features, 3, self.strides, "conv2")
        self.gn2 = self._norm("gn2")
        self.conv3 = self._conv(out, 1, 1, "conv3")
        self.gn3 = self._norm("gn3", zero=True)
        self.conv1.build(input_shape)
        mid = tuple(input_shape[:-1]) + (self.features,)
        self.gn1.build(mid)
        self.conv2.build(mid)
        self.gn2.build(mid)
        self.conv3.build(mid)
        self.gn3.build(tuple(input_shape[:-1]) + (out,))
        if self.needs_projection:
            self.conv_proj = self._conv(out, 1, self.strides, "conv_proj")
            self.gn_proj = self._norm("gn_proj")
            self.conv_proj.build(input_shape)
            self.gn_proj.build(tuple(input_shape[:-1]) + (out,))
        self.built = True

    def call(self, x, training=None):
        if self.remat and training is True:
            return rematerialized(self, self._forward, x)
        return self._forward(x)

    def _forward(self, x):
        residual = x
        if self.needs_projection:
            residual = self.gn_proj(self.conv_proj(x))
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def get_config(self):
        return with_arguments(super().get_config(), self, (
            "features", "strides", "groups", "epsilon", "standardization",
            "std_eps", "remat"))
