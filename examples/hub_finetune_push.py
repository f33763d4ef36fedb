"""Load a ViT from the Hugging Face Hub, fine-tune it on your images, and
push it back: the round trip of a Hub user.

At full size (downloads into the Hub cache; ``HF_TOKEN`` for a private
repository)::

    python examples/hub_finetune_push.py --data flowers/ \\
        --source hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k \\
        --steps 500 --save vit-flowers/ --push your-name/vit-flowers

``--source`` takes a timm repository (``hf-hub:timm/...``), a transformers
one (``hf-hub:google/vit-base-patch16-224``) or a local folder of either;
``--layout`` picks what ``--save`` writes (``timm``, the default, or
``transformers``). Without ``--push`` the upload is only printed: the
saved folder is what ``huggingface_hub.HfApi().upload_folder`` sends.
"""

import argparse


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default=(
        "hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"))
    p.add_argument("--data", required=True,
                   help="a folder with one sub-folder of images per class")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--save", default="vit-finetuned")
    p.add_argument("--layout", default="timm", choices=("timm", "transformers"))
    p.add_argument("--push", metavar="REPO",
                   help="upload --save to this Hub repository (needs HF_TOKEN)")
    args = p.parse_args(argv)

    import numpy as np

    import keras_vit.train as kt
    from keras_vit import zoo

    train = kt.load_data(args.data)
    # A new zero-initialised head for the folder's classes; the rest of the
    # weights (and the resolution) come from the source.
    model = zoo.load(args.source, num_classes=train.num_classes)
    size = model.input_shape[1]
    recipe = kt.compile_for_finetune(
        model, total_steps=args.steps, warmup_steps=max(1, args.steps // 10),
        batch_size=args.batch_size, learning_rate=args.learning_rate,
        label_names=train)  # the model names the folder's classes
    ds = kt.dataset(train, size, recipe.batch_size)
    history = model.fit(ds.repeat(), steps_per_epoch=args.steps, epochs=1,
                        verbose=2)
    print(f"final loss: {history.history['loss'][-1]:.4f}")

    names = list(getattr(train, "class_names", None) or []) or None
    zoo.save_pretrained(model, args.save, labels=names, layout=args.layout)
    print(f"saved: {args.save} ({args.layout} layout)")
    # What the Hub will serve loads back with the same numbers.
    images, _ = next(iter(kt.dataset(train, size, 8, training=False)))
    again = zoo.load(args.save)
    diff = float(np.max(np.abs(np.asarray(again(images))
                               - np.asarray(model(images)))))
    print(f"reloaded from {args.save}: max |logit diff| {diff:.2e}")
    upload = (f"huggingface_hub.HfApi().upload_folder("
              f"repo_id={args.push or 'your-name/vit-finetuned'!r}, "
              f"folder_path={args.save!r}, repo_type='model')")
    if args.push:
        import huggingface_hub

        huggingface_hub.HfApi().create_repo(args.push, exist_ok=True)
        huggingface_hub.HfApi().upload_folder(
            repo_id=args.push, folder_path=args.save, repo_type="model")
        print(f"pushed: {upload}")
    else:
        print(f"to push: {upload}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
