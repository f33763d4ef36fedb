"""Where does a ViT look? Attention rollout (the paper's Figure 6) on your
own photo, plus the model's top-5 classes.

At full size, with the released ImageNet weights::

    python examples/inspect_attention.py --image my_photo.jpg \\
        --model ViT-B/16 --out rollout.png

Without ``--image`` it uses scikit-image's astronaut photo. Prints the
top-5 labels and writes a PNG with the photo, the photo weighted by the
rollout map and the map in colour. What it shows, in a dozen lines of
``keras_vit.analysis``: attention of every layer and head, fused into one
map by attention rollout (Abnar & Zuidema, 2020, as in Appendix D.8).
"""

import argparse
import os
import tempfile


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", help="a photo (default: the astronaut)")
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--weights", default="auto",
                   help="'auto' (the released ones), a tag, a file, or none")
    p.add_argument("--image-size", type=int, default=None,
                   help="default: the weights' resolution")
    p.add_argument("--out", default="rollout.png")
    args = p.parse_args(argv)

    import numpy as np

    from keras_vit import analysis, zoo
    from keras_vit.zoo.preprocessing import softmax

    weights = None if args.weights == "none" else args.weights
    model = zoo.load(args.model, weights=weights, image_size=args.image_size)
    size = model.input_shape[1]
    if args.image:
        pixels = analysis.load_images([args.image], size)  # [0, 255]
    else:
        from PIL import Image
        from skimage import data

        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "astronaut.png")
            Image.fromarray(data.astronaut()).save(path)
            pixels = analysis.load_images([path], size)
    x = zoo.preprocess_input(pixels)  # [-1, 1], the official range

    scores = analysis.attention_maps(model, x)  # (1, layers, heads, N, N)
    joint = analysis.attention_rollout(scores)
    heatmap = analysis.rollout_map(model, joint)[0]  # the patch grid
    analysis.plot_rollout(pixels[0].astype("uint8"), heatmap, args.out,
                          title=f"{args.model}: attention rollout")

    probs = softmax(np.asarray(model.predict(x, verbose=0)))
    for _, name, score in zoo.decode_predictions(probs, top=5,
                                                 labels=model)[0]:
        print(f"{100 * score:5.1f}%  {name}")
    print(f"map: {heatmap.shape[0]}x{heatmap.shape[1]} patches, "
          f"sum {float(heatmap.sum()):.3f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
