"""Parameter counts of the zoo's named models at 224 px with a 1000-class
head, keyed by zoo name: the official figures (vit_jax's models_test.py,
the paper) where they were published, else timm 1.0.31's
``sum(p.numel() for p in model.parameters())`` for the same architecture
(``vit_*``, ``vit_*_r*`` hybrids, ``resnetv2_{depth}x{width}_bit``),
built once by hand. The model tests check the package's count, built and
by formula, against these."""

PARAMS_224_1000 = {
    "ViT-Ti/16": 5_717_416,
    "ViT-S/16": 22_050_664,
    "ViT-S/32": 22_878_952,
    "ViT-B/16": 86_567_656,
    "ViT-B/32": 88_224_232,
    "ViT-B/8": 86_576_872,
    "ViT-L/16": 304_326_632,
    "ViT-L/32": 306_535_400,
    "ViT-H/14": 632_045_800,
    "R50+ViT-B/16": 98_659_112,
    "R26+ViT-S/32": 36_431_912,
    "R26+ViT-B/32": 101_383_976,
    "R50+ViT-L/32": 328_994_856,
    "R+ViT-Ti/16": 6_337_704,
    "BiT-R50x1": 25_549_352,
    "BiT-R50x3": 217_319_080,
    "BiT-R101x1": 44_541_480,
    "BiT-R101x3": 387_934_888,
    "BiT-R152x2": 236_335_208,
    "BiT-R152x4": 936_533_224,
}


def of_family(prefix, strip=False):
    """The counts of the names starting with ``prefix`` (``"ViT-"``,
    ``"BiT-"``) or, for ``prefix="+"``, the hybrids; ``strip`` drops the
    prefix from the keys."""
    if prefix == "+":
        return {n: c for n, c in PARAMS_224_1000.items() if "+" in n}
    return {n[len(prefix):] if strip else n: c
            for n, c in PARAMS_224_1000.items()
            if n.startswith(prefix) and "+" not in n}
