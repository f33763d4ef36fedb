"""A checkpoint layout declared once and read both ways, and the strict load
every layout shares.

A layout is a list of :class:`Rule`: a model variable's path (or several),
the source's key (or several), and the form the source holds it in.

>>> rules = Layout("toy", [Rule("block_{i}/dense/kernel", "blocks.{i}.fc.weight",
...                             "linear")])
>>> rules.key_of("block_3/dense/kernel")
'blocks.3.fc.weight'
>>> arrays, _ = rules.read({"blocks.0.fc.weight": np.ones((4, 2))})
>>> arrays["block_0/dense/kernel"].shape
(2, 4)
"""

from __future__ import annotations

import re
import typing

import numpy as np

from keras_vit.base import options
from keras_vit.zoo import checkpoints
from keras_vit.zoo.checkpoints import CheckpointError, as_array, assign_all
from keras_vit.zoo.position_tables import fit_position_tables


def _fit(value, shape):
    """``value`` in ``shape`` where it holds as many numbers; else as it
    is, for the loader to report as mis-shaped by name."""
    if shape is not None and int(np.prod(value.shape)) == int(np.prod(shape)):
        return value.reshape(shape)
    return value


def _unit_window(value):
    """A (1, 1, in, out) kernel as (in, out); any other as it is."""
    if value.ndim == 4 and tuple(value.shape[:2]) == (1, 1):
        return value.reshape(value.shape[2:])
    return value


#: How a source holds an array: ``(to_model(value, shape), to_source(value))``.
FORMS = {
    "same": (lambda v, s: v, lambda v: v),
    # Any shape of as many numbers; the source's is flat.
    "flat": (_fit, lambda v: v.reshape(-1)),
    # A PyTorch Linear's (out, in) weight; the kernel's first axis is its
    # input (a query kernel (D, heads, head_dim)).
    "linear": (lambda v, s: _fit(np.asarray(v).T, s),
               lambda v: v.reshape(v.shape[0], -1).T),
    # The same, the kernel's last axis its output.
    "linear_out": (lambda v, s: _fit(np.asarray(v).T, s),
                   lambda v: v.reshape(-1, v.shape[-1]).T),
    # A position table without its leading axis, (N, D) for (1, N, D).
    "table": (lambda v, s: v[None], lambda v: v[0]),
    # A PyTorch Linear over patches flattened (P, P, C); an HWIO kernel.
    "patch_linear": (lambda v, s: np.asarray(v).T.reshape(s),
                     lambda v: v.reshape(-1, v.shape[-1]).T),
    # A PyTorch convolution's OIHW kernel; the model's is HWIO.
    "conv": (lambda v, s: np.asarray(v).transpose(2, 3, 1, 0),
             lambda v: v.transpose(3, 2, 0, 1)),
    # A 1x1 convolution's HWIO kernel for a Dense (BiT's head).
    "dense_1x1": (lambda v, s: _unit_window(v),
                  lambda v: v.reshape((1, 1) + v.shape)),
    # A PyTorch 1x1 convolution's (out, in, 1, 1) for a Dense.
    "torch_dense_1x1": (
        lambda v, s: _unit_window(np.asarray(v).transpose(2, 3, 1, 0)),
        lambda v: v.T[:, :, None, None]),
}

# The forms whose read rearranges the numbers (a transpose): a source array
# holding as many numbers in another shape would be read scrambled, so it
# must have the shape the layout writes.
_ARRANGED = ("linear", "linear_out", "patch_linear", "conv",
             "torch_dense_1x1")


def _written_shape(rule, shapes, keys):
    """The shape of each of ``keys`` source arrays that :meth:`Layout.write`
    makes of model arrays of ``shapes`` (read on zero-byte views)."""
    pieces = [FORMS[rule.form][1](np.lib.stride_tricks.as_strided(
        np.zeros(1, "float32"), s, (0,) * len(s))).shape for s in shapes]
    joined = list(pieces[0])
    joined[rule.axis] = sum(p[rule.axis] for p in pieces)
    joined[0] //= keys
    return tuple(joined)


_FIELD = re.compile(r"\{(\w+)([+-]\d+)?(?::(\w+))?\}")


class _Pattern:
    """A name with numbered fields: ``"blocks.{i}.norm1.weight"``;
    ``{s-1}`` shows the field less one, ``{u:02d}`` in two digits."""

    def __init__(self, text):
        self.text, self.fields, regex, pos = text, [], "", 0
        for m in _FIELD.finditer(text):
            regex += re.escape(text[pos:m.start()]) + r"(\d+)"
            self.fields.append((m.group(1), int(m.group(2) or 0),
                                m.group(3) or "d"))
            pos = m.end()
        self.regex = re.compile(regex + re.escape(text[pos:]))

    def match(self, name):
        m = self.regex.fullmatch(name)
        if m is None:
            return None
        values = {}
        for (field, shift, _), text in zip(self.fields, m.groups()):
            if values.setdefault(field, int(text) - shift) != int(text) - shift:
                return None
        return values

    def format(self, values):
        parts = iter(self.fields)
        return _FIELD.sub(lambda m: format(
            values[(f := next(parts))[0]] + f[1], f[2]), self.text)


class Rule:
    """One weight (or one packed group) of a layout.

    ``model``: the variable's path, or several the source packs along
    ``axis`` (timm's ``qkv``; pieces of different sizes split by the
    model's shapes); ``key``: the source's key, or several joined along
    that axis; ``form``: a key of :data:`FORMS`; ``variant``: the name a
    writer chooses this rule by over the plain one (the reader takes
    either). A rule of no model path names a key the reader passes over.
    """

    def __init__(self, model, key, form="same", variant=None, axis=0):
        if form not in FORMS:
            raise ValueError(f"form={form!r} is not one of {sorted(FORMS)}")
        self.model = [_Pattern(p) for p in _as_tuple(model)]
        self.keys = [_Pattern(k) for k in _as_tuple(key)]
        self.form, self.variant, self.axis = form, variant, axis

    def __repr__(self):
        return (f"Rule({[p.text for p in self.model]}, "
                f"{[k.text for k in self.keys]}, {self.form!r})")


def torch_module(path, key, form="linear", variant=None):
    """The rules of a PyTorch module ``key`` for the Keras layer ``path``:
    a Linear's (``weight`` in ``form``), or a norm's (``form="norm"``),
    of the layout's ``variant`` (None: the plain rules).

    >>> torch_module("encoder_norm", "norm", "norm")[0]
    Rule(['encoder_norm/gamma'], ['norm.weight'], 'same')
    """
    if form == "norm":
        return [Rule(f"{path}/gamma", f"{key}.weight", variant=variant),
                Rule(f"{path}/beta", f"{key}.bias", variant=variant)]
    return [Rule(f"{path}/kernel", f"{key}.weight", form, variant),
            Rule(f"{path}/bias", f"{key}.bias", "flat", variant)]


def option_rules(source, norm, dense, conv, batch_norm):
    """The rules of every option row's weights
    (:func:`keras_vit.base.options.weight_rules`) in ``source``, each
    layer's given by ``norm(path, key)``, ``dense``, ``conv`` and
    ``batch_norm``."""
    def dense_out(path, key):  # a PyTorch Linear's weight: "linear_out"
        return [Rule([p.text for p in r.model], [k.text for k in r.keys],
                     "linear_out" if r.form == "linear" else r.form,
                     r.variant, r.axis) for r in dense(path, key)]

    return options.weight_rules(source, {
        "norm": norm, "dense": dense, "dense_out": dense_out, "conv": conv,
        "batch_norm": batch_norm,
        "vector": lambda path, key: [Rule(path, key)]})


def torch_batch_norm(path, key):
    """A PyTorch BatchNorm's rules for a Keras BatchNormalization."""
    return [*[Rule(f"{path}/{p}", f"{key}.{q}") for p, q in (
        ("gamma", "weight"), ("beta", "bias"),
        ("moving_mean", "running_mean"),
        ("moving_variance", "running_var"))],
        Rule((), f"{key}.num_batches_tracked")]


def _as_tuple(value):
    return (value,) if isinstance(value, str) else tuple(value)


class Layout:
    """A source's rules (:class:`Rule`), read both ways: :meth:`read`
    and :meth:`write`."""

    def __init__(self, name, rules):
        self.name, self.rules = name, list(rules)

    def renamed(self, keys, name=None):
        """This layout with the source keys ``keys`` (pattern -> pattern)
        spelled anew.

        >>> toy = Layout("toy", [Rule("scale_{i}", "blocks.{i}.ls1.gamma")])
        >>> toy.renamed({"blocks.{i}.ls1.gamma": "blocks.{i}.gamma_1"}).key_of(
        ...     "scale_2")
        'blocks.2.gamma_1'
        """
        return Layout(name or self.name, [
            Rule([p.text for p in rule.model],
                 [keys.get(k.text, k.text) for k in rule.keys], rule.form,
                 rule.variant, rule.axis) for rule in self.rules])

    def _for_path(self, path, variants=()):
        found = None
        for rule in self.rules:
            for pattern in rule.model:
                values = pattern.match(path)
                if values is None:
                    continue
                if rule.variant is None and found is None:
                    found = (rule, values)
                elif rule.variant is not None and rule.variant in variants:
                    return rule, values
        return found or (None, None)

    def key_of(self, path, variants=()):
        """The source's key of the model variable ``path`` (the packed
        array's, for one of a group), or None."""
        rule, values = self._for_path(path, variants)
        return None if rule is None else rule.keys[0].format(values)

    def _for_key(self, key):
        for rule in self.rules:
            for pattern in rule.keys:
                values = pattern.match(key)
                if values is not None:
                    return rule, values
        return None, None

    def unknown(self, keys):
        """The ``keys`` no rule names (weights the model has no place for)."""
        return [k for k in keys if self._for_key(k)[0] is None]

    def read(self, arrays, shapes=None, absent=None):
        """``(values, names)``: the source's ``arrays`` in the model's form
        by variable path (reshaped to ``shapes[path]`` where it holds as
        many numbers), and each path's source key. A group with a key
        absent is left out, its paths in ``absent`` (a dict, filled)."""
        shapes, absent = shapes or {}, {} if absent is None else absent
        values, names, groups = {}, {}, set()
        for key in arrays:
            rule, fields = self._for_key(key)
            if rule is None or not rule.model:
                continue
            group = tuple(k.format(fields) for k in rule.keys)
            paths = [p.format(fields) for p in rule.model]
            lacking = [k for k in group if k not in arrays]
            if lacking:
                for path in paths:
                    absent[path] = (f"{', '.join(lacking)} (beside "
                                    f"{', '.join(k for k in group if k in arrays)})")
            if group in groups or lacking:
                continue
            groups.add(group)
            taken = [p for p in paths if p in values]
            if taken:
                raise CheckpointError(
                    f"the {self.name} checkpoint holds {taken[0]} twice: in "
                    f"{names[taken[0]]} and in {', '.join(group)}")
            parts = [as_array(arrays[k]) for k in group]
            # Booleans, integers, complex numbers, strings: not weights.
            other = [(k, p.dtype) for k, p in zip(group, parts)
                     if p.dtype.kind in "biucmMOSU"]
            if other:
                key, dtype = other[0]
                raise CheckpointError(
                    f"the {self.name} checkpoint's {key} holds {dtype} "
                    f"({dtype.str!r}), not a number type the model's float "
                    f"weight {', '.join(paths)} takes")
            try:
                pieces = self._pieces(rule, parts, paths, shapes)
            except (ValueError, IndexError) as e:
                shown = ", ".join(f"{k} {tuple(np.shape(p))}"
                                  for k, p in zip(group, parts))
                raise CheckpointError(
                    f"the {self.name} checkpoint's {shown} is not the "
                    f"{rule.form!r} form of the model's {', '.join(paths)}: "
                    f"{e}") from None
            values.update(zip(paths, pieces))
            names.update((path, group[0]) for path in paths)
        return values, names

    @staticmethod
    def _pieces(rule, parts, paths, shapes):
        """The model's arrays ``paths`` from the source's ``parts``."""
        to_model = FORMS[rule.form][0]
        if rule.form in _ARRANGED and all(p in shapes for p in paths):
            want = _written_shape(rule, [shapes[p] for p in paths],
                                  len(parts))
            for part in parts:
                shape = tuple(np.shape(part))
                if shape != want and np.prod(shape) == np.prod(want):
                    raise ValueError(f"expected {want}")
        if len(parts) == len(paths) == 1:
            return [to_model(parts[0], shapes.get(paths[0]))]
        joined = np.concatenate([np.atleast_1d(p) for p in parts], rule.axis)
        rows = joined.shape[rule.axis]
        across = int(np.prod(joined.shape)) // max(rows, 1)
        sizes = ([int(np.prod(shapes[p])) // max(across, 1) for p in paths]
                 if all(p in shapes for p in paths) else None)
        if sizes is None or sum(sizes) != rows:
            if rows % len(paths):
                raise ValueError(f"{rows} rows do not split in {len(paths)}")
            sizes = [rows // len(paths)] * len(paths)
        cuts = np.cumsum(sizes)[:-1]
        return [to_model(piece, shapes.get(path)) for path, piece in zip(
            paths, np.split(joined, cuts, axis=rule.axis))]

    def write(self, arrays, variants=()):
        """The model's ``arrays`` (``{variable path: array}``) as the
        source's ``{key: array}``, writing the rules' ``variants``."""
        out, done, nowhere = {}, set(), []
        for path in arrays:
            rule, fields = self._for_path(path, variants)
            if rule is None:
                nowhere.append(path)
                continue
            paths = tuple(p.format(fields) for p in rule.model)
            if paths in done:
                continue
            done.add(paths)
            to_source = FORMS[rule.form][1]
            pieces = [to_source(np.asarray(arrays[p])) for p in paths]
            joined = (np.concatenate(pieces, rule.axis) if len(pieces) > 1
                      else pieces[0])
            keys = [k.format(fields) for k in rule.keys]
            for key, piece in zip(keys, np.split(joined, len(keys))
                                  if len(keys) > 1 else [joined]):
                out[key] = np.ascontiguousarray(piece)
        if nowhere:
            raise ValueError(f"the {self.name} layout has no place for the "
                             f"model's weights {sorted(nowhere)[:6]}")
        return out


class ByPath(Layout):
    """Arrays already named by the model's variable paths."""

    def __init__(self, name="keras_vit"):
        super().__init__(name, [])

    def key_of(self, path, variants=()):
        return path

    def unknown(self, keys):
        return []

    def read(self, arrays, shapes=None, absent=None):
        return ({k: as_array(v) for k, v in arrays.items()},
                {k: k for k in arrays})

    def write(self, arrays, variants=()):
        return dict(arrays)


#: The model's own variable paths.
BY_PATH = ByPath()


def model_arrays(model, layout_name):
    """``{variable path: array}`` of a plain float model (a quantized or
    LoRA model refused naming how to get one)."""
    checkpoints.check_model(model)
    checkpoints.check_plain(model, layout_name)
    return {v.path: np.asarray(v.numpy()) for v in model.weights}


def with_zeros(arrays, shapes):
    """``arrays`` with float32 zeros for each name of ``shapes`` (name ->
    shape) they lack.

    >>> sorted(with_zeros({"q": np.ones(2)}, {"q": (2,), "k": (2,)}))
    ['k', 'q']
    """
    out = dict(arrays)
    for name, shape in shapes.items():
        out.setdefault(name, np.zeros(shape, "float32"))
    return out


#: The head's variables, the representation layer, the attention pool.
HEAD = ("head/kernel", "head/bias", "head_dist/kernel", "head_dist/bias")
PRE_LOGITS = ("pre_logits/kernel", "pre_logits/bias")
POOL = "pooling/"
_BLOCK = re.compile(r"^encoder_block_(\d+)/")


def variables(model, layout, skip=HEAD):
    """``{variable path: variable}`` of a plain float ``model``, each of
    its weights but those in ``skip`` with a key in ``layout``."""
    checkpoints.check_model(model)
    checkpoints.check_plain(model, layout.name)
    targets = {v.path: v for v in model.weights}
    unmapped = [p for p in targets if layout.key_of(p) is None
                and p not in skip]
    if unmapped:
        raise CheckpointError(
            f"model={model.name!r} has weights with no {layout.name} "
            f"checkpoint equivalent: {unmapped[:10]}")
    return targets


def _classes_differ(got, want):
    """True for a head kernel of the model's rank whose number of classes
    (the last axis) differs from the model's."""
    got, want = tuple(got), tuple(want)
    return len(got) == len(want) > 0 and got[-1] != want[-1]


def _returns_tokens(model):
    """True for a model built without a head or pooling (all tokens)."""
    config = model.get_config() if hasattr(model, "get_config") else {}
    return (isinstance(config, dict) and not config.get("include_top", True)
            and config.get("pooling") is None)


def _position_hint(model, paths):
    """Names the model's position embedding when its tables differ."""
    if not any(p.startswith("position_embedding") for p in paths):
        return None
    kind = getattr(model, "position_embedding", "learned_1d")
    placement = getattr(model, "position_embedding_placement", "stem")
    return (f"position embeddings differ: the model has position_embedding="
            f"{kind!r}, position_embedding_placement={placement!r}; build it "
            "with the checkpoint's kind and placement (a table of one kind "
            "does not convert into another)")


def listed(what, items):
    """``what (count): a, b, ...``: the distinct ``items``, 20 at most."""
    items = list(dict.fromkeys(items))
    return (f"{what} ({len(items)}): " + ", ".join(items[:20])
            + (" ..." if len(items) > 20 else ""))


def load(model, layout, arrays, *, source_name, keep_pre_logits=None,
         source_grid=None, replace_head=True, fresh_head=False):
    """Loads the source's ``arrays`` (``{key: array}`` of ``layout``) into
    ``model``, strictly (:func:`keras_vit.zoo.convert.load_weights`): a
    head of another number of classes (kernel and bias) is zeroed, unless
    ``replace_head=False`` (mis-shaped); a source without a head is
    refused, unless ``fresh_head=True`` (the caller asked a new head).
    Returns ``{"resized_posemb", "head", "pre_logits"[, ...]}``."""
    targets = variables(model, layout)
    absent = {}
    given, names = layout.read(
        arrays, {p: tuple(v.shape) for p, v in targets.items()}, absent)
    unexpected = layout.unknown(arrays)
    report = {"resized_posemb": None, "head": None, "pre_logits": None}

    has_head = "head/kernel" in given
    wants_head = "head/kernel" in targets
    # A whole head of other classes, or none when a new one is asked: the
    # model's starts at zero.
    other = replace_head and all(
        p in given and _classes_differ(given[p].shape, targets[p].shape)
        for p in ("head/kernel", "head/bias") if p in targets)
    replaced = wants_head and (other if has_head else fresh_head)
    if has_head and not wants_head:
        report["head"] = "dropped"
    elif replaced:
        report["head"] = "replaced"
    elif has_head:
        report["head"] = "loaded"
    if report["head"] in ("dropped", "replaced"):
        for path in HEAD:
            given.pop(path, None)

    if "pre_logits/kernel" in given and "pre_logits/kernel" not in targets:
        if replaced or not wants_head:
            for path in PRE_LOGITS:
                given.pop(path, None)
            report["pre_logits"] = "dropped"
    elif "pre_logits/kernel" in given and replaced and (
            keep_pre_logits is False):
        raise CheckpointError(
            "keep_pre_logits=False but the model has a pre_logits layer; "
            "build it with representation_size=None")
    if "pre_logits/kernel" in targets and "pre_logits/kernel" in given:
        report["pre_logits"] = "loaded"

    # A model that returns the tokens ignores an attention-pool head.
    if not any(p.startswith(POOL) for p in targets) and _returns_tokens(
            model):
        pool = [p for p in given if p.startswith(POOL)]
        for path in pool:
            given.pop(path)
        if pool:
            report["attention_pool"] = "dropped"

    problems = []
    missing = [p for p in targets if p not in given
               and not (replaced and p in HEAD)]
    unexpected += [names[p] for p in given if p not in targets]
    fit_position_tables(model, given, targets, lambda p: p, report,
                        problems, source_grid, names)
    mis_shaped = [
        f"{names[p]}: checkpoint {tuple(given[p].shape)} vs model "
        f"{tuple(v.shape)}" for p, v in targets.items()
        if p in given and tuple(given[p].shape) != tuple(v.shape)]

    def blocks(paths):
        return {int(m.group(1)) for p in paths if (m := _BLOCK.match(p))}

    if blocks(given) != blocks(targets):
        problems.append(f"encoder blocks: checkpoint {len(blocks(given))}, "
                        f"model {len(blocks(targets))}")
    if missing:
        problems.append(listed("missing from the checkpoint",
                                [absent.get(p) or layout.key_of(p)
                                 for p in missing]))
    if unexpected:
        problems.append(listed("unexpected in the checkpoint", unexpected))
    if mis_shaped:
        problems.append(f"mis-shaped ({len(mis_shaped)}): "
                        + "; ".join(mis_shaped[:20])
                        + (" ..." if len(mis_shaped) > 20 else ""))
    hint = _position_hint(model, missing + [
        p for p in given if p not in targets])
    if hint:
        problems.append(hint)
    if problems:
        raise CheckpointError(
            f"The checkpoint source={source_name} does not fit model="
            f"{model.name!r} (is it another architecture?):\n  "
            + "\n  ".join(problems))
    assign_all([(var, None if replaced and p in HEAD else given[p])
                for p, var in targets.items()], source_name)
    return report


__all__: typing.List[str] = ["BY_PATH", "FORMS", "Layout", "Rule", "load",
                             "model_arrays", "torch_module"]
