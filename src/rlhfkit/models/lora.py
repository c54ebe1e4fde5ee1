"""LoRA (Hu et al. 2021) on the pipeline's models, with peft: adapters on a causal LM or on the
backbone of a reward / value model, the model as its own reference with the adapter off, and
folding the adapters back into the base weights.

The LoRA reference model is the same weights with the adapter disabled (``reference_mode``),
as in TRL's peft path, never a second copy in memory; where its pass should run beside the
policy's, a view of those weights in modules of its own (``base_view``).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from torch import nn
from transformers.pytorch_utils import Conv1D

from rlhfkit.models.loading import ScalarHeadModel


def add_lora(
    model: nn.Module,
    *,
    r: int = 8,
    alpha: int = 16,
    dropout: float = 0.0,
    target_modules: list[str] | None = None,
):
    """Add LoRA adapters with peft; only adapter weights (and a scalar head) stay trainable.

    ``target_modules=None`` uses peft's per-architecture defaults (GPT-2: ``c_attn``;
    llama-like: ``q_proj``, ``v_proj``). A causal LM comes back as a ``PeftModel``; a
    ``ScalarHeadModel`` keeps its class, with the adapter on its backbone and its head trainable.
    """
    target = model.backbone if isinstance(model, ScalarHeadModel) else model
    model_type = getattr(target.config, "model_type", None)
    if (
        target_modules is None
        and model_type not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    ):
        raise ValueError(
            f"add_lora: target_modules=None but peft has no default for model_type "
            f"{model_type!r}; pass target_modules=[...] (names of its Linear layers)"
        )
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        # GPT-2 stores its projections as Conv1D, whose weight is transposed vs nn.Linear.
        fan_in_fan_out=any(isinstance(m, Conv1D) for m in target.modules()),
        task_type="FEATURE_EXTRACTION" if target is not model else "CAUSAL_LM",
    )
    peft_model = get_peft_model(target, config)
    if target is model:
        return peft_model
    model.backbone = peft_model
    model.score.requires_grad_(True)
    return model


def _peft_part(model: nn.Module) -> PeftModel | None:
    if isinstance(model, PeftModel):
        return model
    backbone = getattr(model, "backbone", None)
    return backbone if isinstance(backbone, PeftModel) else None


def is_lora_lm(model: nn.Module) -> bool:
    """Whether ``model`` is a causal LM with LoRA adapters (``add_lora``)."""
    return isinstance(model, PeftModel)


@contextmanager
def reference_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Run a LoRA model as its own reference: the same base weights, adapter disabled.

    The caller still wraps the forward in ``torch.no_grad()``.
    """
    peft_model = _peft_part(model)
    if peft_model is None:
        raise ValueError(
            f"reference_mode needs a LoRA model (from add_lora), got {type(model).__name__}"
        )
    with peft_model.disable_adapter():
        yield model


def base_view(model: nn.Module) -> nn.Module:
    """The base model of a LoRA causal LM as a module of its own whose parameters are the LoRA
    model's base weights themselves (shared: no second copy): its reference, computing what
    ``reference_mode`` computes, that can run while the policy runs (``reference_mode``
    switches the one module's adapter off, so nothing else may use it meanwhile)."""
    if not is_lora_lm(model):
        raise ValueError(f"base_view needs a LoRA causal LM (add_lora), got {type(model).__name__}")
    inner = model.get_base_model()
    # deepcopy with every tensor already "copied" as itself: new modules, the same tensors.
    shared = {id(t): t for t in itertools.chain(inner.parameters(), inner.buffers())}
    view = copy.deepcopy(inner, shared)
    for name, module in list(view.named_modules()):
        if isinstance(module, LoraLayer):
            view.set_submodule(name, module.get_base_layer())
    return view


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold the adapters into the base weights and return a plain (non-peft) model."""
    peft_model = _peft_part(model)
    if peft_model is None:
        raise ValueError(
            f"merge_lora needs a LoRA model (from add_lora), got {type(model).__name__}"
        )
    merged = peft_model.merge_and_unload()
    if peft_model is model:
        return merged
    model.backbone = merged
    return model


def merged_copy(model: nn.Module) -> nn.Module:
    """What a finished run saves: a copy of ``model`` with its adapters folded into the base
    weights (stock transformers loads it as a plain model), or ``model`` itself without LoRA.
    The live model keeps its trained adapter."""
    return merge_lora(copy.deepcopy(model)) if _peft_part(model) is not None else model
