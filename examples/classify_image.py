"""Classify a photo with a released checkpoint, and look at what changes
with the resolution.

    python examples/classify_image.py                       # ViT-B/16, a cat photo
    python examples/classify_image.py --model R50+ViT-B/16 --image my.jpg
    python examples/classify_image.py --weights ViT-B_16.npz --image-size 224

Without network access, put the checkpoint in the cache (the error message
says where) or pass ``--weights`` a local ``.npz``. The default photo is the
cat that scikit-image ships (``skimage.data.chelsea``).
"""

import argparse

import numpy as np

from keras_vit import zoo
from keras_vit.data import images


def load_image(path, size):
    """One photo as the model's input batch: decoded by keras_vit.data.images
    (the decoder of ``keras-vit predict``, training and the serving
    signature: EXIF rotation, palettes, alpha, the first GIF frame), then
    the official evaluation resize (bilinear, no crop)."""
    if path is None:
        from skimage import data

        pixels = data.chelsea()
    else:
        pixels = images.read(path)
    # Pixels stay in [0, 255]: the model is built with its preprocessing.
    return zoo.preprocess_input(pixels, size, scale=False)[None]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B/16")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--image", default=None)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()

    model = zoo.load(args.model, weights=args.weights,
                     image_size=args.image_size, include_preprocessing=True)
    size = model.get_config()["image_size"]
    logits = np.asarray(model.predict(load_image(args.image, size), verbose=0))[0]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    record = getattr(model, "zoo_weights", None)
    label_set = record.labels if record else {
        1000: "imagenet2012", 21843: "imagenet21k"}.get(len(logits))
    names = zoo.labels(label_set) if label_set else None
    print(f"{model.zoo_name} at {size}x{size} "
          f"({model.count_params():,} parameters)")
    for i in np.argsort(-probs)[: args.top]:
        label = names[i][1].split(",")[0] if names else f"class {i}"
        print(f"  {probs[i]:7.2%}  {label}")


if __name__ == "__main__":
    main()
