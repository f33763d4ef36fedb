"""transformers' files: its configs (:mod:`.tables`), its state-dict names
(:mod:`.layout`), the ViT reader (:mod:`.hub`), the family's readers
(DeiT, DINOv2, DINOv3, CLIP, AIMv2: :mod:`.family`; SigLIP:
:mod:`.siglip`) and the writer (:mod:`.writer`)."""
