"""The official releases: the ``.npz`` files of vit_jax and big_vision
(:mod:`.release`), read lazily (:mod:`.npz`), and BiT's ResNetV2 layout
(:mod:`.bit`)."""
