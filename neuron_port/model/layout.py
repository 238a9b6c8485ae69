"""What every layer of a model is, from its config alone (no weights are allocated).

``describe(config_or_model)`` answers the field report's first question — which layers own a
KV cache and which read another layer's — together with each layer's attention type, head
counts and head size (they differ by type), and a parameter account computed on the meta
device. Given a model instance it also checks the config's claims against the modules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from neuron_port.families import DecoderFamily, family_for, family_of


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer.

    ``kv_source`` is the layer whose K/V this layer attends (itself for a KV owner);
    ``window`` is the sliding window (None for full attention).
    """

    index: int
    attention: str  # "sliding" | "full"
    n_q: int
    n_kv: int
    head_dim: int
    window: int | None
    kv_source: int
    k_eq_v: bool
    intermediate_size: int

    @property
    def is_owner(self) -> bool:
        return self.kv_source == self.index


@dataclass(frozen=True)
class ParamAccount:
    """Real parameter counts (tied LM head counted once)."""

    total: int
    embedding: int
    per_layer_embedding: int
    transformer: int


@dataclass(frozen=True)
class Layout:
    """A model's decoder structure as the port needs it, with its family adapter resolved once
    (``family``: looked up from ``model_type`` when the layout is made, then carried; a pickled
    layout carries the model type only and resolves it again where it lands)."""

    model_type: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    layers: tuple[LayerSpec, ...]
    kv_owners: tuple[int, ...]
    params: ParamAccount
    per_layer_input_size: int
    softcap: float | None
    sliding_window: int | None  # None when no layer slides
    tied_embeddings: bool  # LM head shares the word embedding
    disagreements: tuple[str, ...] = field(default=())
    family: DecoderFamily = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.family is None:
            object.__setattr__(self, "family", family_for(self.model_type))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "family"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, family=family_for(state["model_type"]))

    def to_json(self) -> dict[str, Any]:
        """JSON fields: model_type, num_layers, layers, kv_owners, params (+ a few extras)."""
        layers = [asdict(spec) for spec in self.layers]
        return {
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "sliding_window": self.sliding_window,
            "per_layer_input_size": self.per_layer_input_size,
            "softcap": self.softcap,
            "tied_embeddings": self.tied_embeddings,
            "layers": layers,
            "kv_owners": list(self.kv_owners),
            "params": asdict(self.params),
            "disagreements": list(self.disagreements),
        }

    def owner_specs(self) -> list[LayerSpec]:
        return [self.layers[i] for i in self.kv_owners]

    def kv_readers(self) -> dict[int, int]:
        """KV owner -> how many layers attend its K/V (itself and the layers sharing it): each of
        them reads it once per decode step, so sharing saves memory, not traffic."""
        readers = dict.fromkeys(self.kv_owners, 0)
        for spec in self.layers:
            readers[spec.kv_source] += 1
        return readers


def count_params(config: Any, family: DecoderFamily | None = None) -> ParamAccount:
    """Parameter account of a text config, built on the meta device (nothing allocated)."""
    family = family or family_for(config.model_type)
    # The class is imported before the device mode is entered: torch 2.8 cannot import
    # torch._dynamo for the first time (as transformers' modeling modules do) under one.
    causal_lm = family.causal_lm_class(config.model_type)
    with torch.device("meta"):
        model = causal_lm(config)
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() already de-duplicates tied weights
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    emb = family.word_embedding(model).weight.numel()
    ple_module = family.per_layer_embedding(model)
    ple = ple_module.weight.numel() if ple_module is not None else 0
    return ParamAccount(total=total, embedding=emb, per_layer_embedding=ple, transformer=total - emb - ple)


def _layout_from_config(config: Any, family: DecoderFamily) -> Layout:
    window = family.sliding_window(config)
    specs = []
    for i in range(family.num_layers(config)):
        full = family.is_full(config, i)
        specs.append(
            LayerSpec(
                index=i,
                attention="full" if full else "sliding",
                n_q=family.n_q(config, i),
                n_kv=family.n_kv(config, i),
                head_dim=family.head_dim(config, i),
                window=None if full else window,
                kv_source=family.kv_source(config, i),
                k_eq_v=family.k_eq_v(config, i),
                intermediate_size=family.intermediate_size(config, i),
            )
        )
    return Layout(
        model_type=config.model_type,
        hidden_size=family.hidden_size(config),
        vocab_size=family.vocab_size(config),
        num_layers=family.num_layers(config),
        layers=tuple(specs),
        kv_owners=tuple(s.index for s in specs if s.is_owner),
        params=count_params(config, family),
        per_layer_input_size=family.per_layer_input_size(config),
        softcap=family.softcap(config),
        sliding_window=window,
        tied_embeddings=family.tied_embeddings(config),
        family=family,
    )


def check_model(layout: Layout, model: nn.Module) -> list[str]:
    """Compare the config's claims with the modules; one sentence per disagreement."""
    family = layout.family
    found: list[str] = []
    layers = family.decoder_layers(model)
    if len(layers) != layout.num_layers:
        found.append(f"config says {layout.num_layers} layers, model has {len(layers)}")
    for spec, layer in zip(layout.layers, layers, strict=False):
        proj, _ = family.layer_projections(layer, spec.index)
        k, v = proj.get("k"), proj.get("v")
        if not spec.is_owner and k is not None:
            found.append(f"layer {spec.index}: config says KV-shared (reads layer {spec.kv_source}) but it has a K projection")
        if spec.is_owner and k is None:
            found.append(f"layer {spec.index}: config says it owns KV but it has no K projection")
        if spec.is_owner and spec.k_eq_v and v is not None:
            found.append(f"layer {spec.index}: config says k_eq_v but it has a V projection")
        if spec.is_owner and not spec.k_eq_v and v is None:
            found.append(f"layer {spec.index}: config says separate V but it has no V projection")
        q_out = proj["q"].weight.shape[0]
        if q_out != spec.n_q * spec.head_dim:
            found.append(f"layer {spec.index}: Q projection has {q_out} outputs, config implies {spec.n_q} x {spec.head_dim}")
        if k is not None and k.weight.shape[0] != spec.n_kv * spec.head_dim:
            found.append(
                f"layer {spec.index}: K projection has {k.weight.shape[0]} outputs, config implies {spec.n_kv} x {spec.head_dim}"
            )
    return found


def describe(config_or_model: Any) -> Layout:
    """The layout of a text config, or of a model instance (with a module check).

    An adapter hook that misses the config or the modules raises an AdapterError naming it."""
    family = family_of(config_or_model) if isinstance(config_or_model, nn.Module) else family_for(config_or_model.model_type)
    try:
        if isinstance(config_or_model, nn.Module):
            layout = _layout_from_config(family.text_config_of(config_or_model), family)
            problems = check_model(layout, config_or_model)
            return Layout(**{**layout.__dict__, "disagreements": tuple(problems)})
        return _layout_from_config(config_or_model, family)
    except (AttributeError, KeyError, TypeError, IndexError) as exc:
        raise family.hook_error(exc) from exc


def format_table(layout: Layout) -> str:
    """A readable per-layer table."""
    p = layout.params
    lines = [
        f"model_type {layout.model_type}: {layout.num_layers} layers, hidden {layout.hidden_size}, "
        f"vocab {layout.vocab_size}, window {layout.sliding_window or '-'}, softcap {layout.softcap}",
        f"params: total {p.total / 1e9:.3f} B = embedding {p.embedding / 1e9:.3f} B + per-layer embedding "
        f"{p.per_layer_embedding / 1e9:.3f} B + transformer {p.transformer / 1e9:.3f} B",
        f"KV owners ({len(layout.kv_owners)}): {', '.join(map(str, layout.kv_owners))}",
        "",
        f"{'layer':>5} {'attn':>7} {'n_q':>4} {'n_kv':>4} {'head':>5} {'window':>6} {'kv_src':>6} {'k_eq_v':>6} {'mlp':>6}",
    ]
    for s in layout.layers:
        src = "own" if s.is_owner else str(s.kv_source)
        lines.append(
            f"{s.index:>5} {s.attention:>7} {s.n_q:>4} {s.n_kv:>4} {s.head_dim:>5} {str(s.window or '-'):>6} "
            f"{src:>6} {str(s.k_eq_v).lower():>6} {s.intermediate_size:>6}"
        )
    for d in layout.disagreements:
        lines.append(f"DISAGREES: {d}")
    return "\n".join(lines)


__all__ = ["LayerSpec", "ParamAccount", "Layout", "describe", "check_model", "count_params", "format_table"]
