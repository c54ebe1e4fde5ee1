"""Reward models on disk in the standard Hugging Face format: a sequence classifier with one
label (``AutoModelForSequenceClassification``, ``num_labels=1``: ``GPT2ForSequenceClassification``,
``LlamaForSequenceClassification``, ...), as TRL's ``RewardTrainer`` writes and reads them.
``models.loading.RewardModel`` writes this format and reads it with its trained head, so a
reward model moves between rlhfkit, TRL and stock transformers unchanged.

Where rlhfkit's scalar head and the Hugging Face one differ, and how the format bridges it:

- Bias. Hugging Face's ``score`` has none; rlhfkit's has one: InstructGPT's normalisation
  writes its shift there, and float rounding in the pairwise loss's gradient (zero in exact
  arithmetic) moves it a little while training. On save the bias is folded into the bias of the
  final layer norm (``ln_f``): ``b_norm += bias * w / (w . w)`` adds exactly ``bias`` to
  ``w . h``, so transformers scores as rlhfkit does, to float rounding. A final norm without a
  bias (RMSNorm: Llama, Mistral, Qwen, SmolLM2) cannot carry it: there the bias is not trained
  (``bias_is_portable``) and a normalisation shift is left out of what stock tools read (a
  warning says by how much).
- Bit for bit. Under bf16 autocast the folded form rounds differently from the unfolded one,
  enough for a PPO run not to repeat. ``score_bias.safetensors`` keeps the bias and the norm's
  bias before the fold, with the head and norm values they were folded into; rlhfkit restores
  them when the checkpoint still holds exactly those values, and ignores the file otherwise
  (a model changed by another tool keeps its own weights).
- Last token. transformers reads the score at the last token that is not ``pad_token_id``,
  rlhfkit at the last token of the attention mask, EOS included. They agree when the pad is a
  token of its own, as rlhfkit's always is (``load_tokenizer``); a checkpoint whose pad id is
  its EOS id (TRL's frequent ``pad = eos``) was scored by transformers at the token before the
  trailing EOS, and rlhfkit, reading it at the EOS, warns.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForSequenceClassification
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
from transformers.utils import cached_file

from rlhfkit.errors import UsageError

logger = logging.getLogger(__name__)

SCORE_BIAS = "score_bias.safetensors"
_CLASSIFIER = "ForSequenceClassification"  # the end of every such architecture's name
# Where transformers' decoder models keep the norm whose output is ``last_hidden_state``.
_FINAL_NORMS = ("ln_f", "final_layer_norm", "final_layernorm", "norm_f", "norm")


# --------------------------------------------------------------------------- what a dir holds
def model_file(path_or_name: str | os.PathLike, filename: str, revision: str | None) -> str | None:
    """Local path of ``filename`` in a local dir or hub repo (downloaded), None if absent."""
    return cached_file(
        path_or_name,
        filename,
        revision=revision,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )


def is_sequence_classifier(path_or_name: str | os.PathLike, revision: str | None = None) -> bool:
    """Whether ``config.json`` names a ``*ForSequenceClassification`` architecture."""
    config_path = model_file(path_or_name, "config.json", revision)
    if config_path is None:
        return False
    architectures = json.loads(Path(config_path).read_text()).get("architectures") or []
    return any(name.endswith(_CLASSIFIER) for name in architectures)


# --------------------------------------------------------------------------- reading
def load_sequence_classifier(
    path_or_name: str | os.PathLike, **kwargs
) -> tuple[nn.Module, nn.Linear]:
    """The base transformer and the ``score`` head of a one-label sequence classifier;
    ``kwargs`` go to ``from_pretrained``. A checkpoint with more labels, or whose head is not
    a linear ``score``, is refused: it is no reward model."""
    model = AutoModelForSequenceClassification.from_pretrained(path_or_name, **kwargs)
    name = type(model).__name__
    if model.config.num_labels != 1:
        raise UsageError(
            f"reward model {str(path_or_name)!r}: {name} with num_labels="
            f"{model.config.num_labels}; a reward model gives one score (num_labels=1)"
        )
    score = getattr(model, "score", None)
    if not isinstance(score, nn.Linear):
        raise UsageError(
            f"reward model {str(path_or_name)!r}: {name} has no linear `score` head; rlhfkit "
            "reads decoder sequence classifiers (GPT2ForSequenceClassification, "
            "LlamaForSequenceClassification, ...)"
        )
    pad, eos = model.config.pad_token_id, getattr(model.config, "eos_token_id", None)
    if pad is not None and pad == eos:
        logger.warning(
            "%s: pad_token_id is the EOS id (%s): transformers scored it at the token before a "
            "trailing EOS, rlhfkit scores at the EOS itself",
            path_or_name,
            pad,
        )
    return model.base_model, score


def restore_exact(model: nn.Module, path_or_name: str | os.PathLike, revision=None) -> bool:
    """Put back the unfolded bias of ``score_bias.safetensors`` (module docstring) into a
    ``ScalarHeadModel`` just loaded from ``path_or_name``; False where there is none to
    restore or the checkpoint no longer holds the values it was folded into."""
    side_path = model_file(path_or_name, SCORE_BIAS, revision)
    if side_path is None:
        return False
    side = load_file(side_path)
    state = model.state_dict()
    checks = {k.removeprefix("check."): v for k, v in side.items() if k.startswith("check.")}
    restore = {k: v for k, v in side.items() if not k.startswith("check.")}
    # In the file's dtype: a model stored in bf16 and loaded in float32 holds the same values.
    same = (k in state and torch.equal(state[k].cpu().to(v.dtype), v) for k, v in checks.items())
    if not all(same):
        logger.warning(
            "%s: %s does not match the weights (changed since rlhfkit saved them); ignored",
            path_or_name,
            SCORE_BIAS,
        )
        return False
    if set(restore) - set(state):
        return False
    with torch.no_grad():
        for key, value in restore.items():
            state[key].copy_(value)
    return True


# --------------------------------------------------------------------------- writing
def classifier_class_name(config) -> str | None:
    """The one-label sequence classifier of ``config``'s architecture, if transformers has one."""
    return MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(config.model_type)


def final_norm(backbone: nn.Module) -> tuple[str, nn.Module] | None:
    """(name, module) of the backbone's final layer norm, if it has a bias to fold into."""
    hidden = backbone.config.hidden_size
    for name in _FINAL_NORMS:
        norm = getattr(backbone, name, None)
        bias = getattr(norm, "bias", None)
        if isinstance(bias, torch.Tensor) and bias.shape == (hidden,):
            return name, norm
    return None


def bias_is_portable(backbone: nn.Module) -> bool:
    """Whether the standard format can carry a score bias on this backbone (``final_norm``)."""
    return final_norm(backbone) is not None


def folded_norm_bias(norm_bias: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    """``norm_bias + bias * w / (w . w)``: then ``w . h`` grows by exactly ``bias`` (computed
    in float64, stored in the norm's dtype)."""
    w = weight.detach().double().flatten()
    shift = bias.detach().double().flatten() * w / (w @ w)
    return (norm_bias.detach().double() + shift).to(norm_bias.dtype)


def save_sequence_classifier(backbone: nn.Module, score: nn.Linear, path: Path) -> bool:
    """Write ``backbone`` and ``score`` as a one-label sequence classifier in ``path`` (the
    caller saves the tokenizer); False, nothing written, where transformers has no such class
    for the architecture. The bias is folded as the module docstring says."""
    name = classifier_class_name(backbone.config)
    if name is None:
        return False
    if backbone.config.pad_token_id is None:
        raise ValueError("save_sequence_classifier: set the model's config.pad_token_id first")
    config = copy.deepcopy(backbone.config)
    config.architectures = [name]
    config.num_labels = 1
    with torch.device("meta"):  # a shell: our modules replace its (unallocated) ones
        shell = AutoModelForSequenceClassification.from_config(config)
    head = nn.Linear(score.in_features, 1, bias=False, device="meta")
    head.weight = score.weight
    setattr(shell, shell.base_model_prefix, backbone)
    shell.score = head
    with _bias_folded(backbone, score, path):
        shell.save_pretrained(path)
    return True


@contextmanager
def _bias_folded(backbone: nn.Module, score: nn.Linear, path: Path) -> Iterator[None]:
    """The final norm's bias with ``score.bias`` folded in while the block writes, the values
    before the fold in ``path/score_bias.safetensors``; the live model is untouched after."""
    bias = score.bias
    if bias is None or not torch.any(bias != 0):
        yield
        return
    cpu = {"score.bias": bias.detach().cpu(), "check.score.weight": score.weight.detach().cpu()}
    found = final_norm(backbone)
    if found is None:
        logger.warning(
            "%s has no bias in its final norm: the standard format cannot carry the score "
            "bias %.4g, so stock transformers give scores that much below rlhfkit's",
            type(backbone).__name__,
            bias.item(),
        )
        save_file({k: v.contiguous() for k, v in cpu.items()}, path / SCORE_BIAS)
        yield
        return
    name, norm = found
    before = norm.bias.detach().clone()
    folded = folded_norm_bias(before, score.weight, bias)
    cpu[f"backbone.{name}.bias"] = before.cpu()
    cpu[f"check.backbone.{name}.bias"] = folded.cpu()
    save_file({k: v.contiguous() for k, v in cpu.items()}, path / SCORE_BIAS)
    with torch.no_grad():
        norm.bias.copy_(folded)
    try:
        yield
    finally:
        with torch.no_grad():
            norm.bias.copy_(before)
