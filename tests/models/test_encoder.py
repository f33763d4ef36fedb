"""keras_vit.models.encoder: the checks every encoder model (ViT,
Axial-ViT) shares before it builds."""

import pytest


@pytest.mark.parametrize("builder", ["vit", "axial_vit"])
def test_a_position_table_that_cannot_fit_is_refused_before_building(
        builder, monkeypatch):
    # Both encoder models once tried to allocate a position table that
    # could never fit; the shared encoder check counts it, naming the image
    # size. Sides past MAX_IMAGE_SIDE are refused before that
    # (tests/models/test_image_sizes.py), so the table here is within the
    # cap: 1-pixel patches of 4096x4096 images, 16.8M tokens (64 GiB), on a
    # machine with 16 GiB available.
    import keras_vit.models.memory

    monkeypatch.setattr(keras_vit.models.memory, "available_memory",
                        lambda: 16 << 30)
    with pytest.raises(ValueError, match=r"image_size=4096 \(16,777,21"
                                         r"[67] tokens of position "
                                         r"embedding\).*GiB of weights"):
        getattr(keras_vit, builder)(4096, 1, 1024, 1, 2, 64, 3)
