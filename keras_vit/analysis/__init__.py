"""Inspecting a Vision Transformer: section 4.5 and Appendix D.7/D.8.

Numbers (numpy, no plotting library needed):

* :func:`attention_model`, :func:`attention_maps`: attention of every layer
  and head, (B, layers, heads, N, N);
* :func:`attention_rollout`, :func:`rollout_map`, :func:`overlay`: Figure 6;
* :func:`mean_attention_distance`: Figure 7 right, Figure 11;
* :func:`position_embedding_similarity`: Figure 7 centre, Figure 10;
* :func:`embedding_filter_components`: Figure 7 left.

Figures (matplotlib, loaded on first use): :func:`plot_filters`,
:func:`plot_position_similarity`, :func:`plot_attention_distance`,
:func:`plot_rollout`, and :func:`inspect`, which writes them all:

>>> import numpy as np, keras_vit
>>> from keras_vit import analysis
>>> model = keras_vit.vit(32, 8, 16, 2, 2, 32, 3)
>>> scores = analysis.attention_maps(model, np.zeros((1, 32, 32, 3)))
>>> g = analysis.token_geometry(model)
>>> analysis.rollout_map(g, analysis.attention_rollout(scores)).shape
(1, 4, 4)
>>> analysis.mean_attention_distance(scores, g.grid_size, g.patch_pixels,
...                                  g.num_prefix_tokens).shape
(2, 2)
"""

from keras_vit.base import lazy

# Loaded on first use: the command line lists `inspect` without importing
# Keras, and matplotlib is only needed for the figures.
__getattr__, __dir__ = lazy.attach(__name__, lazy.names_of({
    ".attention": (
        "TokenGeometry", "attention_maps", "attention_model",
        "attention_rollout", "mean_attention_distance", "overlay",
        "patch_distances", "rollout_map", "token_geometry",
        "uniform_attention_distance", "upsample"),
    ".embeddings": (
        "FilterComponents", "embedding_filter_components",
        "neighbour_similarity", "position_embedding_similarity"),
    ".plots": (
        "plot_filters", "plot_position_similarity",
        "plot_attention_distance", "plot_rollout"),
    ".report": ("inspect", "load_images"),
}))

__all__ = [
    "FilterComponents", "TokenGeometry", "attention_maps", "attention_model",
    "attention_rollout", "embedding_filter_components", "inspect",
    "load_images", "mean_attention_distance", "neighbour_similarity",
    "overlay", "patch_distances", "plot_attention_distance", "plot_filters",
    "plot_position_similarity", "plot_rollout",
    "position_embedding_similarity", "rollout_map", "token_geometry",
    "uniform_attention_distance", "upsample",
]
