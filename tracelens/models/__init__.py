"""One model description shared by MFU, the layout audit and the simulator.

`get_model("qwen3.5-27b")` or `get_model("path/to/config.json")` -> ModelSpec; FLOPs in
`tracelens.models.flops`, GPU peaks in `tracelens.models.hardware`, the layout audit in
`tracelens.models.audit`.
"""

from tracelens.models.spec import (
    FULL,
    LINEAR,
    ModelSpec,
    get_model,
    load_preset,
    model_from_config,
    preset_names,
)

__all__ = ["FULL", "LINEAR", "ModelSpec", "get_model", "load_preset", "model_from_config", "preset_names"]
