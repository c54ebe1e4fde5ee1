"""Load, wrap and save the models of the RLHF pipeline: policy, reference, reward and value.

Follows the reward/value model conventions of TRL and DeepSpeed-Chat: a causal-LM backbone
(the base transformer without its LM head) plus a linear head that maps each hidden state to
one scalar. The reward model reads that scalar at the last real token of each sequence
(``scores`` (B,)); the critic reads it at every token (``values`` (B, T)). As in InstructGPT,
the critic may be initialised from the reward model checkpoint. The head is initialised as in
OpenAI's lm-human-preferences: weight ~ N(0, 1/sqrt(hidden + 1)), bias 0.

Departures:
- Padding: the pad token is always a distinct ``<|pad|>`` token, never an alias of EOS (TRL and
  many tutorials set ``pad = eos``, which hides the EOS from masks built from the pad id).
- Position ids are always derived from the attention mask, so a left-padded sequence gets the
  same positions, hence the same score, as the same sequence right-padded.
- Checkpoints are a plain backbone directory (``AutoModel.from_pretrained`` opens it) plus
  ``score_head.safetensors`` and ``score_head.json``, instead of TRL's
  ``AutoModelForSequenceClassification``; safetensors only, never pickle.
- The head always runs in float32 (hidden states are cast to it), even on a bf16 backbone,
  so small score differences are not lost to rounding; TRL keeps the head in the model dtype.

LoRA adapters, the adapter-off reference and merging are in ``lora.py``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import torch
from peft import PeftConfig, PeftModel
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.activations import GELUTanh, NewGELUActivation
from transformers.utils import cached_file

from rlhfkit.checkpoint import atomic_dir
from rlhfkit.ops.masks import last_token_index, position_ids_from_mask
from rlhfkit.runtime.activations import gelu_tanh
from rlhfkit.runtime.packing import enable_packing

logger = logging.getLogger(__name__)

PAD_TOKEN = "<|pad|>"
HEAD_WEIGHTS = "score_head.safetensors"
HEAD_CONFIG = "score_head.json"
HEAD_FORMAT = "rlhfkit.scalar_head"


# --------------------------------------------------------------------------- tokenizer & LM
def load_tokenizer(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    gguf_file: str | None = None,
    padding_side: str = "right",
):
    """Load a tokenizer (hub name or local dir) whose pad token is distinct from its EOS.

    A missing pad token (or one aliased to EOS) is replaced by a new special ``<|pad|>``;
    the caller must then resize the model's embeddings (``load_causal_lm(tokenizer=...)`` does).
    """
    tokenizer = AutoTokenizer.from_pretrained(
        name_or_path, revision=revision, gguf_file=gguf_file, padding_side=padding_side
    )
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"tokenizer {name_or_path!s} has no eos_token; responses could never end. "
            "Set eos_token in its tokenizer_config.json."
        )
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        # An EOS-aliased pad would make the real EOS look like padding in every mask.
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
        logger.info(
            "tokenizer %s had no distinct pad token; added %s (id %d)",
            name_or_path,
            PAD_TOKEN,
            tokenizer.pad_token_id,
        )
    return tokenizer


def _resize_for(model: PreTrainedModel, tokenizer) -> None:
    """Grow the embedding matrix to cover every token id, and record the pad id."""
    n_rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > n_rows:
        # Mean-initialised new rows keep the new tokens' logits in the usual range.
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        logger.info("resized embeddings from %d to %d rows", n_rows, len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def load_causal_lm(
    name_or_path: str | os.PathLike,
    *,
    tokenizer=None,
    dtype: torch.dtype = torch.float32,
    revision: str | None = None,
    gguf_file: str | None = None,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Load a causal LM by hub name or local path, matched to ``tokenizer`` when given, with
    the fused GELU (``fuse_gelu``)."""
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path,
        dtype=dtype,
        revision=revision,
        gguf_file=gguf_file,
        trust_remote_code=trust_remote_code,
    )
    if tokenizer is not None:
        _resize_for(model, tokenizer)
    return fuse_gelu(model)


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode and no gradients: the frozen reference of the KL penalty."""
    model.eval()
    model.requires_grad_(False)
    return model


def disable_dropout(model: nn.Module) -> nn.Module:
    """Set the probability of every ``nn.Dropout`` in ``model`` to 0 (in place): the RL and
    preference trainers' default, so the first PPO ratio is exactly 1 (as in TRL)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


class TanhGELU(nn.Module):
    """GPT-2's tanh GELU as one call of ``ops.gelu_tanh`` (tables for 16-bit floats on CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh(x)


def fuse_gelu(model: nn.Module) -> nn.Module:
    """Swap the tanh GELU of GPT-2-style models (transformers' ``NewGELUActivation`` and
    ``GELUTanh``) for ``TanhGELU``, in place.

    ``NewGELUActivation`` runs ~8 elementwise kernels forward and more backward; torch's
    ``gelu(approximate="tanh")`` is the same function to float rounding in one kernel, about
    5x faster on CPU, and under bf16 autocast ``ops.gelu_tanh`` reads it from a table, 2-3x
    faster again. Every model rlhfkit loads gets it (training, evaluation, sampling, chat),
    and every trainer gives it to the models it is handed. The weights and the saved model
    are untouched: a checkpoint loads into stock transformers as before.
    """
    for module in model.modules():
        for name, child in module.named_children():
            if type(child) in (NewGELUActivation, GELUTanh):
                setattr(module, name, TanhGELU())
    return model


def prepare_model(
    model: nn.Module, attention: str | None = None, packed: bool = False
) -> nn.Module:
    """What every trainer does to each model it runs: the fused GELU (``fuse_gelu``) and,
    when given, the attention kernel (``"eager"`` or ``"sdpa"``) of every transformer in it
    (a policy, a reference, a scalar-head model's backbone, a peft-wrapped model); with
    ``packed``, packed inputs where the model supports them (``packing.enable_packing``)."""
    fuse_gelu(model)
    if attention is not None:
        for module in model.modules():
            if isinstance(module, PreTrainedModel):
                module.set_attn_implementation(attention)
    if packed:
        enable_packing(model)
    return model


def load_reference(name_or_path: str | os.PathLike, **kwargs) -> PreTrainedModel:
    """``load_causal_lm`` then ``freeze``; kwargs as for ``load_causal_lm``."""
    return freeze(load_causal_lm(name_or_path, **kwargs))


# --------------------------------------------------------------------------- scalar head
class ScalarHeadModel(nn.Module):
    """A transformer backbone plus ``score = Linear(hidden, 1)``: reward model or critic.

    ``per_token=False``: ``forward`` returns ``scores`` (B,), the head at the last real token.
    ``per_token=True``: ``forward`` returns ``values`` (B, T), the head at every token.
    """

    default_per_token = False

    def __init__(self, backbone: nn.Module, *, per_token: bool | None = None):
        super().__init__()
        self.backbone = backbone
        self.per_token = self.default_per_token if per_token is None else per_token
        hidden = backbone.config.hidden_size
        self.score = nn.Linear(hidden, 1)
        # lm-human-preferences: small random init so initial scores are near 0 but not tied.
        nn.init.normal_(self.score.weight, std=1.0 / math.sqrt(hidden + 1))
        nn.init.zeros_(self.score.bias)

    @property
    def config(self):
        return self.backbone.config

    @classmethod
    def from_causal_lm(cls, model: PreTrainedModel, *, per_token: bool | None = None):
        """Wrap the base transformer of a loaded causal LM (its LM head is dropped).

        Pass the plain transformers model; add LoRA afterwards with ``add_lora``.
        """
        return cls(model.base_model, per_token=per_token)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        per_token: bool | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """``kwargs`` go to the backbone: with ``packed_rows`` (``packing.PackedRows.inputs``)
        the values per token come back packed, (1, L)."""
        per_token = self.per_token if per_token is None else per_token
        if position_ids is None:
            # From the mask: left padding must not shift the real tokens' positions.
            position_ids = position_ids_from_mask(attention_mask)  # (B, T)
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **kwargs,
        ).last_hidden_state  # (B, T, H)
        values = self.score(hidden.to(self.score.weight.dtype)).squeeze(-1)  # (B, T)
        if per_token:
            return values
        if "packed_rows" in kwargs:
            return values[0, kwargs["packed_rows"].last]  # (B,)
        last = last_token_index(attention_mask)  # (B,)
        return values.gather(1, last[:, None]).squeeze(1)  # (B,)

    @classmethod
    def from_pretrained(
        cls,
        path_or_name: str | os.PathLike,
        *,
        per_token: bool | None = None,
        dtype: torch.dtype = torch.float32,
        revision: str | None = None,
        trust_remote_code: bool = False,
    ):
        """Load a scalar-head checkpoint, or a plain (causal) LM with a fresh head.

        ``per_token=None`` keeps the class default, so ``ValueModel.from_pretrained(rm_dir)``
        turns a reward model checkpoint into a critic (InstructGPT's critic initialisation).
        """
        head_config = _read_head_config(path_or_name, revision)
        backbone = _load_backbone(path_or_name, head_config, dtype, revision, trust_remote_code)
        model = cls(backbone, per_token=per_token)
        if head_config is None:
            logger.info(
                "%s has no %s; the score head is freshly initialised", path_or_name, HEAD_CONFIG
            )
        else:
            state = load_file(_head_file(path_or_name, HEAD_WEIGHTS, revision))
            model.score.load_state_dict(state)
        return model

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Backbone via its own ``save_pretrained`` (safetensors), then the head next to it."""
        path = Path(save_directory)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path)
        weights = {k: v.detach().contiguous().cpu() for k, v in self.score.state_dict().items()}
        save_file(weights, path / HEAD_WEIGHTS)
        head_config = {
            "format": HEAD_FORMAT,
            "version": 1,
            "hidden_size": self.score.in_features,
            "per_token": self.per_token,
            "lora": isinstance(self.backbone, PeftModel),
        }
        (path / HEAD_CONFIG).write_text(json.dumps(head_config, indent=2) + "\n")


class RewardModel(ScalarHeadModel):
    """Scores (B,) at the last real token (InstructGPT step 2)."""

    default_per_token = False


class ValueModel(ScalarHeadModel):
    """Values (B, T) at every token: the PPO critic."""

    default_per_token = True


def _head_file(path_or_name: str | os.PathLike, filename: str, revision: str | None) -> str | None:
    """Local path of ``filename`` in a local dir or hub repo (downloaded), None if absent."""
    return cached_file(
        path_or_name,
        filename,
        revision=revision,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )


def _read_head_config(path_or_name: str | os.PathLike, revision: str | None) -> dict | None:
    config_path = _head_file(path_or_name, HEAD_CONFIG, revision)
    if config_path is None:
        return None
    config = json.loads(Path(config_path).read_text())
    if config.get("format") != HEAD_FORMAT:
        raise ValueError(
            f"{config_path}: field 'format' is {config.get('format')!r}, expected {HEAD_FORMAT!r}"
        )
    return config


def _load_backbone(path_or_name, head_config, dtype, revision, trust_remote_code) -> nn.Module:
    if head_config is not None and head_config.get("lora"):
        # The directory holds only the adapter; the base weights come from where it says.
        base_path = PeftConfig.from_pretrained(path_or_name).base_model_name_or_path
        base = fuse_gelu(AutoModel.from_pretrained(base_path, dtype=dtype))
        return PeftModel.from_pretrained(base, path_or_name, revision=revision, is_trainable=True)
    # For a causal LM checkpoint AutoModel keeps the base transformer and drops the LM head.
    backbone = AutoModel.from_pretrained(
        path_or_name, dtype=dtype, revision=revision, trust_remote_code=trust_remote_code
    )
    return fuse_gelu(backbone)


# --------------------------------------------------------------------------- atomic save
def save_pretrained_atomic(model: nn.Module, tokenizer, path: str | os.PathLike) -> Path:
    """Save ``model`` (and ``tokenizer`` if given) so that ``path`` is never half-written
    (``atomic_dir``): a crash while writing leaves any previous save at ``path`` untouched.
    A peft model saves its adapter."""
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return Path(path)
