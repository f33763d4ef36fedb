"""A bare JAX ViT training step: the XLA ceiling beside keras_vit.

The paper's ViT (pre-LN blocks, tanh GELU, class-token head) written in
plain ``jax.numpy`` with a hand-written AdamW of Keras' formulas, compiled
as one ``jax.jit`` program that donates its parameters and optimizer
state. benchmarks/accelerator.py times it in the same process and run as
keras_vit's ``train_on_batch``, so that its table separates what XLA costs
(this step against timm + ``torch.compile``) from what Keras and this
package cost (keras_vit against this step).

It reads a keras_vit model's weights (:func:`params_from_keras`), so the
same numbers go through both: tests/benchmarks/test_bare_jax_vit.py checks
on the CPU that its logits and one AdamW step equal keras_vit's.

    params = params_from_keras(keras_vit.vit(224, 16, 768, 12, 12, 3072, 1000))
    step = make_step(heads=12, patch=16, dtype="bfloat16")
    state = adamw_init(params)
    params, state, loss = step(params, state, images, labels)

``attention``: ``"xla"`` (einsums, the softmax in float32, bf16
probabilities), ``"cudnn"`` (JAX's cuDNN kernel over tokens padded to a
multiple of 64 with a key mask, the shape its flash attention trains on:
keras_vit's ``kernels.padded_attention``), ``"padded-xla"`` (the same
through XLA, which runs on a CPU) or ``"cudnn-unpadded"``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

#: Keras' AdamW as benchmarks/accelerator.py compiles it.
ADAMW = dict(learning_rate=1e-4, weight_decay=0.05, beta_1=0.9,
             beta_2=0.999, epsilon=1e-7)


def params_from_keras(model):
    """A plain ViT's weights from a keras_vit model (``keras_vit.vit``):
    float32 arrays, the query/key/value kernels side by side as one
    (width, 3, heads, head width) projection as timm holds them."""
    w = {v.path: np.asarray(v.numpy(), "float32") for v in model.weights}
    blocks = []
    i = 0
    while f"encoder_block_{i}/norm_1/gamma" in w:
        b = f"encoder_block_{i}/"
        a = b + "attention/"
        blocks.append(dict(
            ln1_g=w[b + "norm_1/gamma"], ln1_b=w[b + "norm_1/beta"],
            qkv_k=np.stack([w[a + n + "/kernel"]
                            for n in ("query", "key", "value")], 1),
            qkv_b=np.stack([w[a + n + "/bias"]
                            for n in ("query", "key", "value")], 0),
            out_k=w[a + "out/kernel"], out_b=w[a + "out/bias"],
            ln2_g=w[b + "norm_2/gamma"], ln2_b=w[b + "norm_2/beta"],
            fc1_k=w[b + "mlp/dense_0/kernel"], fc1_b=w[b + "mlp/dense_0/bias"],
            fc2_k=w[b + "mlp/dense_1/kernel"], fc2_b=w[b + "mlp/dense_1/bias"]))
        i += 1
    kernel = w["patch_embedding/conv/kernel"]
    params = dict(
        patch_k=kernel.reshape(-1, kernel.shape[-1]),
        patch_b=w["patch_embedding/conv/bias"], cls=w["class_token/cls"],
        pos=w["position_embedding/pos_embedding"], blocks=blocks,
        norm_g=w["encoder_norm/gamma"], norm_b=w["encoder_norm/beta"],
        head_k=w["head/kernel"], head_b=w["head/bias"])
    return jax.tree_util.tree_map(jnp.asarray, params)


def _layer_norm(x, g, b, eps=1e-6):
    y = x.astype(jnp.float32)
    mean = y.mean(-1, keepdims=True)
    var = jnp.square(y - mean).mean(-1, keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + eps) * g + b
    return y.astype(x.dtype)


def _attention(q, k, v, scale, attention):
    if attention == "xla":
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                            preferred_element_type=jnp.float32)
        probs = jax.nn.softmax(logits * scale, axis=-1).astype(q.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    if attention == "cudnn-unpadded":
        return jax.nn.dot_product_attention(q, k, v, scale=scale,
                                            implementation="cudnn")
    # The package's padded spelling (a plain JAX function): the bare step
    # and keras_vit time the same kernel.
    from keras_vit.runtime.kernels import padded_attention

    return padded_attention(
        q, k, v, scale,
        implementation="cudnn" if attention == "cudnn" else "xla")


def forward(params, images, heads, patch, dtype="float32", attention="xla"):
    """Logits (float32) of images (B, H, W, 3) under a compute ``dtype``
    (the weights cast to it for the products, as Keras' mixed policies
    do; norms and softmax in float32)."""
    def cast(t):
        return t.astype(dtype)

    b, h, w, c = images.shape
    x = images.astype(dtype).reshape(b, h // patch, patch, w // patch,
                                     patch, c)
    x = x.transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, patch * patch * c)
    x = x @ cast(params["patch_k"]) + cast(params["patch_b"])
    cls = jnp.broadcast_to(cast(params["cls"]), (b, 1, x.shape[-1]))
    x = jnp.concatenate([cls, x], 1) + cast(params["pos"])
    width = x.shape[-1]
    scale = 1.0 / math.sqrt(width // heads)
    for p in params["blocks"]:
        y = _layer_norm(x, p["ln1_g"], p["ln1_b"])
        qkv = jnp.einsum("btd,dshk->btshk", y, cast(p["qkv_k"])) + cast(
            p["qkv_b"])
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        o = _attention(q, k, v, scale, attention)
        x = x + jnp.einsum("bthk,hkd->btd", o, cast(p["out_k"])) + cast(
            p["out_b"])
        y = _layer_norm(x, p["ln2_g"], p["ln2_b"])
        y = jax.nn.gelu(y @ cast(p["fc1_k"]) + cast(p["fc1_b"]),
                        approximate=True)
        x = x + y @ cast(p["fc2_k"]) + cast(p["fc2_b"])
    x = _layer_norm(x[:, 0], params["norm_g"], params["norm_b"])
    return (x @ cast(params["head_k"]) + cast(params["head_b"])).astype(
        jnp.float32)


def loss_fn(params, images, labels, heads, patch, dtype, attention):
    logp = jax.nn.log_softmax(forward(params, images, heads, patch, dtype,
                                      attention))
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def adamw_init(params):
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return dict(m=zeros, v=jax.tree_util.tree_map(jnp.zeros_like, params),
                t=jnp.zeros((), jnp.float32))


def adamw_update(params, grads, state, learning_rate, weight_decay, beta_1,
                 beta_2, epsilon):
    """Keras' AdamW: the decay ``w -= w * wd * lr`` first, then Adam with
    its bias corrections folded into the step size."""
    t = state["t"] + 1
    alpha = learning_rate * jnp.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)

    def one(w, g, m, v):
        w = w - w * weight_decay * learning_rate
        m = m + (g - m) * (1 - beta_1)
        v = v + (jnp.square(g) - v) * (1 - beta_2)
        return w - alpha * m / (jnp.sqrt(v) + epsilon), m, v

    flat, tree = jax.tree_util.tree_flatten(params)
    out = [one(*xs) for xs in zip(flat, tree.flatten_up_to(grads),
                                   tree.flatten_up_to(state["m"]),
                                   tree.flatten_up_to(state["v"]))]
    w, m, v = (tree.unflatten([o[i] for o in out]) for i in range(3))
    return w, dict(m=m, v=v, t=t)


def make_step(heads, patch, dtype="bfloat16", attention="xla",
              optimizer=None):
    """One jitted training step ``(params, state, images, labels) ->
    (params, state, loss)`` with its parameters and state donated."""
    hyper = dict(ADAMW, **(optimizer or {}))

    def step(params, state, images, labels):
        loss, grads = jax.value_and_grad(loss_fn)(
            params, images, labels, heads, patch, dtype, attention)
        params, state = adamw_update(params, grads, state, **hyper)
        return params, state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def make_forward(heads, patch, dtype="bfloat16", attention="xla"):
    """The jitted inference forward ``(params, images) -> logits``."""
    return jax.jit(lambda params, images: forward(
        params, images, heads, patch, dtype, attention))
