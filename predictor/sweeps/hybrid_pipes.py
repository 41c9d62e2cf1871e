"""A hybrid model's pipeline splits for the search (`predictor.sweeps.search`): its layer pattern with `|` placed for
each pp and vp so the heaviest segment is as light as it can be (`tracekit.core.hybrid_pattern.pipe_split`, layers
weighed by their forward FLOPs, the last segment carrying the output layer, loss and MTP layers), every split one
Megatron accepts; a pattern whose pipes and pp/vp the user fixed is kept as stated."""
from __future__ import annotations

import dataclasses
from typing import Any

from predictor.architecture.flops import layer_flops_per_token
from predictor.layers.decoder import mtp_layer
from tracekit.core import hybrid_pattern
from tracekit.core.config import TrainingConfig


class HybridPipes:
    """A hybrid model's pipeline splits: its pattern with `|` placed for each pp and vp (module docstring), built
    once per shape; `pattern` None for a GPT model."""

    def __init__(self, model: TrainingConfig, fixed: set[str]):
        settings = model.hybrid
        layout = model.layout
        self.pattern = settings.pattern(model.num_layers, layout.mtp_num_layers if layout else None) \
            if settings is not None else None
        self.model = model
        self.made: dict[tuple[int, int], Any] = {}
        self.keep = bool(self.pattern) and "|" in str(self.pattern).split("/")[0] and \
            {"pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size"} <= fixed
        if self.pattern and not self.keep:
            c = model
            self.weights = [layer_flops_per_token(c, i) for i in range(c.num_layers)]
            mtp = layout.mtp_num_layers if layout and layout.mtp_num_layers else 0
            self.tail = 2.0 * c.hidden_size * c.padded_vocab_size * (1 + mtp) \
                + mtp * layer_flops_per_token(c, mtp_layer(c))

    def settings(self, pp: int, vp: int):
        """The hybrid settings of a candidate of `pp` stages of `vp` chunks each (ConfigError: no such split)."""
        settings = self.model.hybrid
        assert settings is not None and self.pattern is not None
        if self.keep:
            return settings
        if (pp, vp) not in self.made:
            placed = hybrid_pattern.pipe_split(self.pattern, pp * vp, self.weights, self.tail,
                                               settings.dsa_indexer_topk_freq, settings.dsa_indexer_skip_topk_offset)
            self.made[(pp, vp)] = dataclasses.replace(settings, hybrid_layer_pattern=placed,
                                                      hybrid_override_pattern=None, mtp_hybrid_override_pattern=None,
                                                      hybrid_attention_ratio=0.0, hybrid_mlp_ratio=0.0)
        return self.made[(pp, vp)]
