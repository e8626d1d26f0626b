"""A decode's KV cache in buffers allocated once, instead of grown by ``torch.cat`` every step.

transformers' dynamic cache layer appends each decode step's keys and values with ``torch.cat``: a copy of the whole
cache per layer per token (~11% of a batch-16 CPU decode step of a 135M model). :func:`preallocate` turns a
prefilled cache's layers into :class:`BufferedLayer`s, whose keys and values are views of the first ``length``
positions of buffers with room for the whole generation; a step writes its one position in place. The views hold
the same numbers the concatenated tensors did, so attention reads the same values and a decode samples the same
tokens (``tests/unit/engines/hf/test_kv_buffer.py``).

Anything that replaces a layer's tensors (selecting the batch's unfinished rows, cropping) leaves ordinary tensors
behind; the next step copies them into a new buffer of the same room.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class BufferedLayer(DynamicLayer):
    """A dynamic cache layer whose ``keys`` / ``values`` are views into buffers of ``capacity`` positions."""

    capacity: int = 0
    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None
    reallocations: int = 0  # buffers allocated after the first (the room ran out, or the tensors were replaced)

    def _owns(self) -> bool:
        buf = self._key_buffer
        return (buf is not None and self.keys is not None and self.keys.data_ptr() == buf.data_ptr()
                and self.keys.shape[:2] == buf.shape[:2] and self.keys.stride() == buf.stride()
                and self.values is not None and self._value_buffer is not None
                and self.values.data_ptr() == self._value_buffer.data_ptr()
                and self.values.stride() == self._value_buffer.stride())

    def _allocate(self, room: int) -> None:
        """Copy the current keys and values into new buffers of ``room`` positions."""
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        length = keys.shape[-2]
        self.capacity = max(room, length)
        self._key_buffer = keys.new_empty((*keys.shape[:-2], self.capacity, keys.shape[-1]))
        self._value_buffer = values.new_empty((*values.shape[:-2], self.capacity, values.shape[-1]))
        self._key_buffer[..., :length, :] = keys
        self._value_buffer[..., :length, :] = values
        self.keys, self.values = self._key_buffer[..., :length, :], self._value_buffer[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized or self.keys is None or self.keys.numel() == 0:
            return super().update(key_states, value_states, *args, **kwargs)
        length, add = self.keys.shape[-2], key_states.shape[-2]
        if not self._owns() or length + add > self.capacity:
            self.reallocations += self._key_buffer is not None
            self._allocate(max(self.capacity, 2 * (length + add)) if length + add > self.capacity else self.capacity)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[..., length:length + add, :] = key_states
        self._value_buffer[..., length:length + add, :] = value_states
        self.keys = self._key_buffer[..., :length + add, :]
        self.values = self._value_buffer[..., :length + add, :]
        return self.keys, self.values


def plain_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Per-layer (keys, values) of a cache made only of plain dynamic layers (None otherwise: sliding windows,
    quantized or empty layers)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) not in (DynamicLayer, BufferedLayer) or layer.keys is None for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def preallocate(cache, more: int) -> None:
    """Give every plain dynamic layer of ``cache`` room for ``more`` positions past what it holds (in place)."""
    for layer in getattr(cache, "layers", None) or ():
        if type(layer) is DynamicLayer and layer.keys is not None and layer.keys.numel():
            layer.__class__ = BufferedLayer
            layer._allocate(layer.keys.shape[-2] + more)  # type: ignore[attr-defined]  # a BufferedLayer now
        elif type(layer) is BufferedLayer and layer.keys is not None:
            if not layer._owns() or layer.keys.shape[-2] + more > layer.capacity:
                layer._allocate(max(layer.capacity, layer.keys.shape[-2] + more))


def release_layer(cache, index: int) -> None:
    """Let go of layer ``index`` of ``cache`` (its keys, values and buffers): the cache is not used after this."""
    layer = cache.layers[index]
    layer.keys = layer.values = None
    if isinstance(layer, BufferedLayer):
        layer._key_buffer = layer._value_buffer = None


def adopt(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A cache of :class:`BufferedLayer`s over ``layers``' tensors as they are, without a copy: each (keys, values)
    view of the first positions of a larger tensor keeps that tensor as its buffer (room to grow in place); a whole
    tensor is its own buffer. (``DynamicCache(ddp_cache_data=...)`` concatenates every layer onto an empty one: a
    second copy of the whole cache while the first is still held.)"""
    cache = DynamicCache()
    cache.layers = []
    for keys, values in layers:
        layer = BufferedLayer()
        layer.lazy_initialization(keys, values)
        layer._key_buffer = keys if keys._base is None else keys._base
        layer._value_buffer = values if values._base is None else values._base
        layer.capacity = layer._key_buffer.shape[-2]
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache
