"""NNCF's int8 weight compression of an OpenVINO IR, in a child process.

Why a child process: NNCF 3.4 imports torch whenever it is installed
(4.0 s, and a "No CUDA runtime is found" line on stderr) and draws a
progress bar on stdout. Here torch is kept out (1.3 s) and the bar goes to
the child's log.
"""

from __future__ import annotations

import sys


def compress(source, output):
    """int8 weights (asymmetric, per output channel) for every MatMul and
    Convolution of the IR ``source``, written to ``output``; returns how
    many layers were compressed."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # import torch now raises ImportError
    import logging

    import nncf

    from keras_vit.export import openvino as exporter

    nncf.set_log_level(logging.ERROR)
    model = exporter.core().read_model(source)
    model = nncf.compress_weights(model,
                                  mode=nncf.CompressWeightsMode.INT8_ASYM)
    exporter.save(model, output, "int8")
    return {"layers": sum(1 for op in model.get_ops() if _int8_weight(op))}


def _int8_weight(op):
    """Whether ``op`` is a compressed weight: a u8 constant that NNCF
    decompresses as ``(Convert(w) - zero_point) * scale``."""
    if (op.get_type_name() != "Constant"
            or op.get_output_element_type(0).get_type_name() != "u8"):
        return False
    return any(use.get_node().get_type_name() == "Subtract"
               and use.get_index() == 0
               for convert in op.output(0).get_target_inputs()
               for use in convert.get_node().output(0).get_target_inputs())


def main(job_path):
    from keras_vit.export import pipeline

    return pipeline.child_main(
        job_path, lambda job: compress(job["source"], job["output"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
