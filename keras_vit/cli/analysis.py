"""``keras-vit inspect``: the figures of section 4.5 from the command line."""

from __future__ import annotations

import argparse
import os

from keras_vit.cli import options

def register(subparsers):
    """Adds ``inspect`` to an ``argparse`` subparsers object; returns it.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="keras-vit")
    >>> _ = register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["inspect", "ViT-B/16", "a.jpg", "--out",
    ...                           "figs", "--image-size", "384"])
    >>> args.model, args.images, args.out, args.image_size, args.func is run
    ('ViT-B/16', ['a.jpg'], 'figs', 384, True)
    """
    p = options.command(subparsers, "inspect", run,
                        help="attention maps, attention distance, position "
                             "embeddings and filters as PNG figures")
    options.add(p, model="a zoo name (e.g. ViT-B/16, R50+ViT-B/16) or a "
                         ".keras file")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files; one rollout figure each, and the "
                        "attention distance is averaged over all of them")
    options.add(p, out={"required": True,
                        "help": "output directory (created)"})
    options.add(p, weights="weights tag, .npz path or URL for a zoo name "
                           "(default: the model's default weights)",
                image_size="inspect at this resolution (position "
                           "embeddings resized; default: the model's)",
                batch_size={"default": 8, "help": "images per forward pass "
                                                  "(default: 8)"})
    return p


def run(args) -> int:
    """Writes the figures of the paper's section 4.5 as PNGs, plus the
    numbers as analysis.json: embedding-filter principal components
    (Figure 7 left), position-embedding similarity (Figure 7 centre), mean
    attention distance per head and layer (Figure 7 right / Figure 11) and
    one attention-rollout map per image (Figure 6). Images are resized
    (bilinear, no crop) and normalised as the model's weights expect (the
    official [-1, 1], ImageNet's or CLIP's mean and std, or by the model
    itself)."""
    from keras_vit.analysis.report import inspect
    from keras_vit.base.checks import printable

    result = inspect(args.model, args.images, args.out,
                     weights=args.weights or "auto",
                     image_size=args.image_size,
                     batch_size=args.batch_size)
    m = result["model"]
    # The description holds names from files: escape control characters.
    print(f"{printable(m['description'])}: {m['image_size'][0]}x{m['image_size'][1]}, "
          f"grid {m['grid_size'][0]}x{m['grid_size'][1]} (stride "
          f"{m['effective_stride']}), {m['num_layers']} layers x "
          f"{m['num_heads']} heads, {result['num_images']} image(s)")
    per_layer = result["mean_attention_distance"]["per_layer_mean"]
    print("  mean attention distance by layer (pixels): "
          + " ".join(f"{d:.1f}" for d in per_layer))
    skipped = result["embedding_filters"].get("skipped")
    if skipped:
        print(f"  embedding filters skipped: {skipped}")
    print(f"wrote {len(result['files'])} files to "
          f"{printable(result['out_dir'])}:")
    for name in result["files"]:
        print(f"  {printable(os.path.join(result['out_dir'], name))}")
    return 0


def main(argv=None) -> int:
    """``python -m keras_vit.cli.analysis inspect ...``: the subcommand on
    its own."""
    parser = argparse.ArgumentParser(prog="keras-vit")
    register(parser.add_subparsers(dest="command", metavar="COMMAND",
                                   required=True))
    return options.main(parser, argv)


if __name__ == "__main__":
    raise SystemExit(options.start(main))
