"""Build plans from models: named presets and local Hugging Face `config.json` files.

A model contributes its MoE router's shape: K = hidden_size, N = routed experts. Each family maps
a model to the problem shapes it serves (only router_gemm so far). Nothing here touches the
network: a config is a file the release pipeline already has.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cute_aot.artifacts.errors import CuteAotError, UnsupportedProblemError


class ModelConfigError(CuteAotError, ValueError):
    """A model config that cannot give build shapes; names the file."""

    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


@dataclass(frozen=True)
class MoeModel:
    name: str
    hidden_size: int  # K of the router GEMM
    num_experts: int  # N of the router GEMM (routed experts)
    source: str  # "preset" or the config file it was read from


# Router shapes of released MoE models (K = hidden_size, N = routed experts), from their configs.
PRESETS: dict[str, MoeModel] = {
    model.name: model
    for model in (
        MoeModel("deepseek-v3", 7168, 256, "preset"),
        MoeModel("deepseek-v3.2", 7168, 256, "preset"),
        MoeModel("deepseek-v4-pro", 7168, 384, "preset"),
        MoeModel("deepseek-v4-flash", 4096, 256, "preset"),
        MoeModel("glm-5.2", 6144, 256, "preset"),
        MoeModel("inkling", 6144, 264, "preset"),
        MoeModel("gpt-oss-120b", 2880, 128, "preset"),
        MoeModel("gpt-oss-20b", 2880, 32, "preset"),
        MoeModel("kimi-k2", 7168, 384, "preset"),
        MoeModel("qwen3-235b-a22b", 4096, 128, "preset"),
        MoeModel("qwen3-30b-a3b", 2048, 128, "preset"),
    )
}

# Where configs keep the routed expert count (DeepSeek/Kimi/GLM; Qwen-MoE; Mixtral/gpt-oss; ERNIE).
EXPERT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
# Multimodal configs nest the language model's config.
NESTED_CONFIGS = ("text_config", "language_config", "llm_config")


def preset(name: str) -> MoeModel:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise UnsupportedProblemError(
            f"unknown model preset {name!r}; known: {', '.join(PRESETS)}"
        ) from None


def model_from_config(path: str | Path) -> MoeModel:
    """A Hugging Face config.json (or the folder holding one) -> its router shape."""
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
    sections = [config] + [config[n] for n in NESTED_CONFIGS if isinstance(config.get(n), dict)]
    for section in sections:
        experts = next((section[f] for f in EXPERT_FIELDS if _positive_int(section.get(f))), None)
        if experts is None:
            continue
        hidden = section.get("hidden_size", config.get("hidden_size"))
        if not _positive_int(hidden):
            raise ModelConfigError(path, f"has {experts} experts but no integer hidden_size")
        return MoeModel(_model_name(config, path), hidden, experts, str(path))
    raise ModelConfigError(
        path,
        f"no MoE router: none of {', '.join(EXPERT_FIELDS)} is a positive integer "
        "(a dense model has no router GEMM to build)",
    )


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _model_name(config: dict, path: Path) -> str:
    name = config.get("_name_or_path") or path.resolve().parent.name or config.get("model_type")
    return str(name or path)


def router_gemm_shapes(model: MoeModel) -> list[tuple[int, int]]:
    from cute_aot.kernels.router_gemm import check_problem

    try:
        check_problem(1, model.hidden_size, model.num_experts)
    except UnsupportedProblemError as exc:
        raise UnsupportedProblemError(f"model {model.name} ({model.source}): {exc}") from None
    return [(model.hidden_size, model.num_experts)]


# family -> the (K, N)-style problem shapes a model needs from it
FAMILY_SHAPES: dict[str, Callable[[MoeModel], list[tuple]]] = {"router_gemm": router_gemm_shapes}


def shapes_for_models(models: list[MoeModel], families: list[str]) -> dict[str, list[tuple]]:
    """{family: shapes} for these models, each shape once, in model order."""
    shapes: dict[str, list[tuple]] = {}
    for name in families:
        if name not in FAMILY_SHAPES:
            raise UnsupportedProblemError(f"family {name!r} has no mapping from model shapes")
        found = shapes.setdefault(name, [])
        for model in models:
            found += [s for s in FAMILY_SHAPES[name](model) if s not in found]
    return shapes
