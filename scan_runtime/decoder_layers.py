"""A transformers model's decoder layers through the drop-in `scan_layers`, with the model's own forward.

transformers' decoder models run their layers in one loop,

    for decoder_layer in self.layers[: self.config.num_hidden_layers]:
        hidden_states = decoder_layer(hidden_states, attention_mask=..., position_embeddings=(cos, sin), ...)

so `scan_decoder_layers(model)` swaps `layers` for a list whose slices hold one callable: it takes the
hidden states and the keyword arguments the loop passes, and runs every layer of the slice as one scan
over their stacked weights. The layers stay where they were: parameter names (`model.layers.3.mlp.
down_proj.weight`), the state dict, `.to()` and mark_sharding on a layer's weights are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from functorch.compile import default_partition

from scan_runtime.layer_plan import LayerPlan
from scan_runtime.scan import scan_layers


class ScannedLayers(torch.nn.ModuleList):
    """The model's layer list; a slice of it is one scan over the slice's layers."""

    partition_fn: Callable[..., Any] = staticmethod(default_partition)
    plan: LayerPlan | None = None

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, slice):
            return super().__getitem__(index)
        return [_ScanOver(list(self._modules.values())[index], self)]


class _ScanOver:
    """What the model's loop calls as its one decoder layer: a scan over `layers`."""

    def __init__(self, layers: list[torch.nn.Module], owner: ScannedLayers) -> None:
        self.layers = layers
        self.owner = owner

    def __call__(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError("a scanned decoder layer takes the hidden states positionally and the rest by "
                            f"keyword, as transformers' models call them; got {len(args)} more positional")  # fmt: skip
        if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
            # One traced body serves every layer: a cache written per layer would be written by one.
            raise ValueError("scanned decoder layers keep no key/value cache: call the model with use_cache=False")
        return scan_layers(self.layers, hidden_states, partition_fn=self.owner.partition_fn,
                           plan=self.owner.plan, layer_kwargs=kwargs)  # fmt: skip


def scan_decoder_layers(model: torch.nn.Module, partition_fn: Callable[..., Any] = default_partition,
                        plan: LayerPlan | None = None) -> ScannedLayers:  # fmt: skip
    """Make `model`'s decoder layers run as one scan; returns the new layer list.

    `model` is a transformers model (`LlamaForCausalLM`, `MistralForCausalLM`, `MixtralForCausalLM`,
    `GemmaForCausalLM`, ...) or its decoder. A model whose layers differ in what they are given
    (Gemma 2 and 3 alternate sliding-window and full attention, each with its own mask) is refused:
    one scan passes every layer the same arguments. The model's `config.use_cache` is set to False, as
    transformers does for gradient checkpointing: a scanned body is traced once for all layers and
    cannot write each layer's own cache.
    """
    owner, layers = _decoder_layers(model)
    config = getattr(owner, "config", None)
    kinds = sorted(set(getattr(config, "layer_types", None) or ()))
    if len(kinds) > 1:
        raise ValueError(f"{type(owner).__name__}'s layers are of {len(kinds)} kinds ({', '.join(kinds)}), each "
                         "given its own attention mask; one scan gives every layer the same arguments")  # fmt: skip
    classes = sorted({type(layer).__name__ for layer in layers})
    if len(classes) > 1:
        raise ValueError(f"{type(owner).__name__}.layers mixes {', '.join(classes)}; scan_layers needs one kind")
    if config is not None and getattr(config, "use_cache", False):
        config.use_cache = False
    scanned = layers if isinstance(layers, ScannedLayers) else ScannedLayers(list(layers))
    scanned.partition_fn = partition_fn
    scanned.plan = plan
    owner.layers = scanned
    return scanned


def _decoder_layers(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """The module holding the decoder's `layers` list, and the list."""
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return module, layers
    raise ValueError(f"{type(model).__name__} has no `layers` list of decoder layers")
