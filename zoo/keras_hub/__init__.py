"""keras-hub's presets: the reader (:mod:`.io`), its variable names
(:mod:`.layout`), the family's backbones (:mod:`.family`) and the writers
(:mod:`.writer`, :mod:`.family_writer`)."""
