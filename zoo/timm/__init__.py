"""timm's files: its ``VisionTransformer`` arguments (:mod:`.arguments`),
its EVA model's (:mod:`.eva`: DINOv3), its state-dict names
(:mod:`.layout`), the reader of its Hugging Face folders and handles
(:mod:`.hub`) and the writer (:mod:`.writer`)."""
