"""Build plans from models: named presets and local Hugging Face `config.json` files.

A model is its config (a dict, as in config.json). Each kernel family reads from it the shapes it
serves (`ModelShapes.shapes_from_model`), so this module knows no family and no config field
beyond where multimodal configs nest the language model. Nothing here touches the network: a
config is a file the release pipeline already has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cute_aot.artifacts.core.errors import ModelConfigError, UnsupportedProblemError
from cute_aot.kernels import KernelFamily, ModelShapes, capability

Shape = tuple[int, ...]

# Multimodal configs nest the language model's config; its fields are the ones kernels serve.
NESTED_CONFIGS = ("text_config", "language_config", "llm_config")


@dataclass(frozen=True, eq=False)
class Model:
    name: str
    config: dict[str, Any]  # Hugging Face config fields, nested language sections merged in
    source: str  # "preset" or the config file it was read from

    @property
    def where(self) -> str:
        """What an error names: the config file, or the preset."""
        return f"preset {self.name}" if self.source == "preset" else self.source


def _preset(name: str, **config: Any) -> Model:
    return Model(name, config, "preset")


DEEPSEEK_V3 = dict(
    hidden_size=7168,
    n_routed_experts=256,
    intermediate_size=18432,  # dense layers 0-2
    n_shared_experts=1,
    moe_intermediate_size=2048,
    num_attention_heads=128,
    q_lora_rank=1536,
    kv_lora_rank=512,  # multi-head latent attention
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
)

# Released models, as the fields of their config.json that kernel families read (the expert count
# under the field name each model's own config uses).
PRESETS: dict[str, Model] = {
    model.name: model
    for model in (
        _preset("deepseek-v3", **DEEPSEEK_V3),
        _preset("deepseek-v3.2", hidden_size=7168, n_routed_experts=256),
        _preset("deepseek-v4-pro", hidden_size=7168, n_routed_experts=384),
        _preset("deepseek-v4-flash", hidden_size=4096, n_routed_experts=256),
        _preset("glm-5.2", hidden_size=6144, n_routed_experts=256),
        _preset("inkling", hidden_size=6144, n_routed_experts=264),
        _preset("gpt-oss-120b", hidden_size=2880, num_local_experts=128),
        _preset("gpt-oss-20b", hidden_size=2880, num_local_experts=32),
        _preset("kimi-k2", hidden_size=7168, n_routed_experts=384),
        _preset("qwen3-235b-a22b", hidden_size=4096, num_experts=128),
        _preset("qwen3-30b-a3b", hidden_size=2048, num_experts=128),
        _preset(
            "llama-3-8b",
            hidden_size=4096,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=14336,
        ),
        _preset(
            "llama-3-70b",
            hidden_size=8192,
            num_attention_heads=64,
            num_key_value_heads=8,
            intermediate_size=28672,
        ),
        # the gated-delta-rule (linear attention) layers FlashInfer's GDN decode serves
        _preset(
            "qwen3-next-80b-a3b",
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
        ),
        _preset(
            "qwen3-32b",
            hidden_size=5120,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=25600,
        ),
    )
}


def preset(name: str) -> Model:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise UnsupportedProblemError(
            f"unknown model preset {name!r}; known: {', '.join(PRESETS)}"
        ) from None


def merge_language_sections(config: dict[str, Any]) -> dict[str, Any]:
    """The top level with each nested language section laid over it (the section wins: in a
    multimodal config the top-level hidden_size, if any, is not the language model's)."""
    merged = dict(config)
    for name in NESTED_CONFIGS:
        section = config.get(name)
        if isinstance(section, dict):
            merged.update(section)
    return merged


def model_from_config(path: str | Path) -> Model:
    """A Hugging Face config.json (or the folder holding one) -> a Model."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise ModelConfigError(path, f"cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ModelConfigError(path, f"not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ModelConfigError(path, "not a JSON object")
    return Model(_model_name(config, path), merge_language_sections(config), str(path))


def _model_name(config: dict, path: Path) -> str:
    name = config.get("_name_or_path") or path.resolve().parent.name or config.get("model_type")
    return str(name or path)


def family_shapes(model: Model, family: KernelFamily) -> list[Shape]:
    """The shapes `family` needs for `model` ([] when it has nothing for it, or reads no
    model configs)."""
    reader = capability(family, ModelShapes)
    if reader is None:
        return []
    try:
        # A copy: a family must not be able to change a preset for the next caller.
        return list(reader.shapes_from_model(dict(model.config)))
    except UnsupportedProblemError as exc:
        raise ModelConfigError(model.where, f"model {model.name}: {exc}") from None


def shapes_for_models(
    models: Iterable[Model], families: Iterable[KernelFamily]
) -> dict[str, list[Shape]]:
    """{family name: shapes} for these models, each shape once, in model order.

    Every model must give at least one shape to one of the families: a model that gives none
    (a dense model asked of MoE-only families, a config missing its fields) is an error rather
    than a build that quietly leaves it out.
    """
    families = list(families)
    shapes: dict[str, list[Shape]] = {family.name: [] for family in families}
    for model in models:
        found = {family.name: family_shapes(model, family) for family in families}
        if not any(found.values()):
            raise ModelConfigError(
                model.where,
                f"model {model.name} gives no shapes to the families asked "
                f"({', '.join(shapes) or 'none'}): none of them serves it",
            )
        for name, new in found.items():
            shapes[name] += [shape for shape in new if shape not in shapes[name]]
    return shapes
