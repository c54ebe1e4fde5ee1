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
- A reward model is saved as TRL's is, a one-label ``AutoModelForSequenceClassification``
  (``reward_format.py``: how its bias-free head and rlhfkit's biased one meet), and either that
  or a causal LM loads. Critics and LoRA training checkpoints keep rlhfkit's own format, a plain
  backbone directory plus ``score_head.safetensors`` and ``score_head.json``, which also still
  loads as a reward model. Safetensors only, never pickle.
- A local directory rlhfkit wrote (a ``final/``, a checkpoint) is held to its manifest
  (``checkpoint.verify``) before anything of it loads, and a damaged file is refused by name;
  a directory without one (another tool's, the hub's) loads unchecked.
- Loading asks for safetensors (``use_safetensors=True``): a directory holding only a pickle
  checkpoint (``pytorch_model.bin``) is refused, since unpickling runs whatever code the file
  carries, unless the user sets ``RLHFKIT_TRUST_PICKLE=1`` for a source they trust. A local
  path that does not exist, or holds no model, is refused with its name before transformers
  would take it for a hub name.
- The Python code a model ships for its own architecture or tokenizer (``auto_map``) runs only
  with ``trust_remote_code=True`` (every training stage's ``trust_remote_code`` option); a
  model that needs it is otherwise refused with that option named.
- The head always runs in float32 (hidden states are cast to it), even on a bf16 backbone,
  so small score differences are not lost to rounding; TRL keeps the head in the model dtype.

LoRA adapters, the adapter-off reference and merging are in ``lora.py``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import PeftConfig, PeftModel
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rlhfkit.checkpoint import MANIFEST_FILE, STATE_FILE, atomic_dir, verify
from rlhfkit.data.sources import is_hub_name
from rlhfkit.errors import UsageError
from rlhfkit.models.reward_format import (
    is_sequence_classifier,
    load_sequence_classifier,
    model_file,
    restore_exact,
    save_sequence_classifier,
)
from rlhfkit.ops.masks import last_token_index, position_ids_from_mask
from rlhfkit.runtime.activations import fuse_gelu

logger = logging.getLogger(__name__)

PAD_TOKEN = "<|pad|>"
HEAD_WEIGHTS = "score_head.safetensors"
HEAD_CONFIG = "score_head.json"
HEAD_FORMAT = "rlhfkit.scalar_head"
TRUST_PICKLE = "RLHFKIT_TRUST_PICKLE"  # "1": load pickle checkpoints (only from trusted sources)
_SAFETENSORS = ("model", "adapter_model")  # model.safetensors, model-00001-of-00002.safetensors
_PICKLES = ("pytorch_model", "adapter_model")  # pytorch_model.bin, adapter_model.bin
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


# --------------------------------------------------------------------------- where models are
def check_model_source(name_or_path: str | os.PathLike, option: str = "model") -> None:
    """Refuse, naming ``option``, a local path that holds no model (nothing there, an empty
    or other directory, weights only as a pickle) or whose files fail its manifest (a
    ``DamagedError`` naming the file); a name of the hub's form passes."""
    path = Path(name_or_path)
    if not path.exists() and is_hub_name(str(name_or_path)):
        return
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    if not names & {"config.json", "adapter_config.json"}:
        raise UsageError(f"{option} {str(name_or_path)!r}: {_not_a_model(path, names)}")
    verify(path)
    if any(n.startswith(_SAFETENSORS) and ".safetensors" in n for n in names):
        return
    pickles = sorted(n for n in names if n.startswith(_PICKLES))
    if not pickles:
        raise UsageError(f"{option} {str(path)!r}: the directory holds no model.safetensors")
    if os.environ.get(TRUST_PICKLE) != "1":
        raise UsageError(
            f"{option} {str(path)!r}: its weights are a pickle ({pickles[0]}), and unpickling "
            "runs whatever code the file carries, so rlhfkit loads safetensors only. Save the "
            "model with save_pretrained (safetensors) where you trust it, or, if you trust its "
            f"source, set {TRUST_PICKLE}=1"
        )


_WARNED_UNVERIFIED: set[Path] = set()
_ASSETS = Path(__file__).resolve().parents[1] / "assets"


def hold_unverified_weights(model: nn.Module, name_or_path: str | os.PathLike) -> None:
    """A model loaded from a local directory without rlhfkit's manifest (another tool wrote
    it, or its manifest was removed), whose files nothing could check: said once, and its
    weights held finite, so that a damaged file is refused by name rather than sampled from.
    A `UsageError` names the file and the tensor."""
    path = Path(name_or_path)
    if not path.is_dir() or verify(path):
        return
    shipped = path.resolve().is_relative_to(_ASSETS)  # the package's own, installed with it
    if not shipped and path.resolve() not in _WARNED_UNVERIFIED:
        _WARNED_UNVERIFIED.add(path.resolve())
        logger.warning(
            "%s has no %s (not written by rlhfkit, or its manifest removed): its files are not "
            "checked against one; its weights are checked finite",
            path,
            MANIFEST_FILE,
        )
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise UsageError(
                f"model {str(path)!r}: {_file_holding(path, name)} holds {bad} NaN or inf "
                f"values in {name}, so the model is damaged or diverged; use an intact copy "
                "(the directory a stage wrote, with its manifest)"
            )


def _file_holding(path: Path, tensor: str) -> str:
    """The weights file of ``path`` that holds ``tensor`` (a sharded model's index says)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        for name, file in weight_map.items():
            if tensor.endswith(name) or name.endswith(tensor):
                return file
    return "model.safetensors"


def _not_a_model(path: Path, names: set[str]) -> str:
    if not path.exists():
        return (
            "no such directory, nor a hub model name ('name' or 'owner/name'); give the "
            "directory a stage wrote (`rlhfkit sft` writes <output_dir>/final) or a hub name"
        )
    if STATE_FILE in names:
        return (
            "a training checkpoint that holds no model directory (PPO's trained weights, for a "
            f"resume); `rlhfkit export --checkpoint {path} --output_dir <dir>` writes the "
            "model of that step"
        )
    what = "a file" if not path.is_dir() else "an empty directory" if not names else "a directory"
    return (
        f"{what} without config.json, so not a model; a model is the directory "
        "save_pretrained writes (config.json, model.safetensors, the tokenizer's files)"
    )


def _check_tokenizer_source(name_or_path: str | os.PathLike) -> None:
    """Refuse a path without a tokenizer: what ``check_model_source`` refuses, or a model
    directory whose tokenizer was not saved with it."""
    path = Path(name_or_path)
    if path.is_dir() and any((path / name).is_file() for name in _TOKENIZER_FILES):
        verify(path)
        return
    if path.is_dir() and (path / "config.json").is_file():
        raise UsageError(
            f"model {str(path)!r}: the directory holds no tokenizer (tokenizer.json or "
            "tokenizer_config.json); save the tokenizer next to the model (save_pretrained)"
        )
    check_model_source(name_or_path)


def _use_safetensors() -> bool | None:
    """``from_pretrained``'s ``use_safetensors``: True, unless pickles are trusted (then
    transformers' default: safetensors where there are some)."""
    return None if os.environ.get(TRUST_PICKLE) == "1" else True


@contextmanager
def _loading(name_or_path: str | os.PathLike, what: str) -> Iterator[None]:
    """transformers' OSError (not on the hub, offline, files missing) as a ``UsageError``, and
    so its refusal to run a model's own code without ``trust_remote_code``."""
    try:
        yield
    except OSError as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise UsageError(f"{what} {str(name_or_path)!r} does not load: {message}") from error
    except ValueError as error:
        if "trust_remote_code" not in str(error):
            raise
        raise UsageError(
            f"{what} {str(name_or_path)!r} ships Python code of its own (auto_map in its "
            "config), which runs only with trust_remote_code: if you trust its source, set "
            "--trust_remote_code true (trust_remote_code: true in a config file)"
        ) from error


# --------------------------------------------------------------------------- tokenizer & LM
def load_tokenizer(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    gguf_file: str | None = None,
    padding_side: str = "right",
    trust_remote_code: bool = False,
):
    """Load a tokenizer (hub name or local dir) whose pad token is distinct from its EOS;
    ``trust_remote_code`` lets a tokenizer class the model ships run.

    A missing pad token (or one aliased to EOS) is replaced by a new special ``<|pad|>``;
    every model that reads its ids then needs a row for it (``match_vocabulary``, which
    ``load_causal_lm`` and ``ScalarHeadModel.from_pretrained`` call when given the tokenizer).
    """
    if gguf_file is None:
        _check_tokenizer_source(name_or_path)
    with _loading(name_or_path, "tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(
            name_or_path,
            revision=revision,
            gguf_file=gguf_file,
            padding_side=padding_side,
            trust_remote_code=trust_remote_code,
        )
    if tokenizer.eos_token_id is None:
        raise UsageError(
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


def saved_tokenizer(name_or_path: str | os.PathLike, trust_remote_code: bool = False):
    """The tokenizer saved with a model (``load_tokenizer``), or None where there is none."""
    path = Path(name_or_path)
    if path.is_dir():
        if not any((path / name).is_file() for name in _TOKENIZER_FILES):
            return None
        return load_tokenizer(path, trust_remote_code=trust_remote_code)
    try:  # a hub name
        return load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    except UsageError:
        return None


def same_tokenizer(a, b) -> bool:
    """Whether token ids mean the same to both tokenizers: the same vocabulary, added and
    special tokens included (token -> id), and the same EOS id, the token a reward model reads
    its score at. How each splits text may still differ; the ids' meaning may not."""
    if a is b:
        return True
    return a.eos_token_id == b.eos_token_id and a.get_vocab() == b.get_vocab()


def match_vocabulary(model: nn.Module, tokenizer, what: str = "model") -> None:
    """Give ``model`` (a causal LM or a ``ScalarHeadModel``) an embedding row for every id of
    ``tokenizer``, and record its pad id: the one place where every model that reads the
    policy's token ids (policy, reference, critic, reward model) is matched to its tokenizer.

    ``load_tokenizer`` may have added a pad token, one id past the checkpoint's vocabulary, so
    without a row for it the first padded batch would index past the embeddings. The pad alone
    gets one: it is never sampled and only read where the attention mask hides it, so any row
    serves. A model that lacks rows for other ids would read those tokens as noise, so it is
    refused, named by ``what`` (role and path).
    """
    transformer = model.backbone if isinstance(model, ScalarHeadModel) else model
    rows = embedding_rows(transformer)
    if len(tokenizer) > rows:
        if rows != len(tokenizer) - 1 or tokenizer.pad_token_id != rows:
            raise UsageError(_tokens_without_rows(what, rows, tokenizer))
        # Mean-initialised, the new row keeps the pad's logit in the usual range.
        transformer.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        logger.info("%s: added an embedding row for the pad token (id %d)", what, rows)
    transformer.config.pad_token_id = tokenizer.pad_token_id
    if getattr(transformer, "generation_config", None) is not None:
        transformer.generation_config.pad_token_id = tokenizer.pad_token_id


def _tokens_without_rows(what: str, rows: int, tokenizer) -> str:
    return (
        f"{what} has {rows} token embeddings, but the tokenizer it reads "
        f"({tokenizer.name_or_path}) has {len(tokenizer)} tokens: ids {rows} to "
        f"{len(tokenizer) - 1} have no embedding, and rlhfkit adds a row only for the pad "
        "token. Give a model whose embeddings cover that tokenizer (resize_token_embeddings("
        "len(tokenizer)), then save it) or, for a reward model of another vocabulary, save the "
        "tokenizer it was trained with in its directory: it then scores the texts in its own "
        "tokens"
    )


def embedding_rows(model: nn.Module) -> int | None:
    """How many token ids ``model`` has an input embedding for (None: it has no
    ``get_input_embeddings``, as a plain ``nn.Module`` scorer may not)."""
    if not hasattr(model, "get_input_embeddings"):
        return None
    return model.get_input_embeddings().num_embeddings


def check_vocabulary(model: nn.Module, tokenizer, role: str) -> None:
    """Refuse, before any pass, a model that would be fed ids of ``tokenizer`` it has no
    embedding for: a model built without ``match_vocabulary`` (through the Python API, say)
    would otherwise stop on an ``IndexError`` deep in a forward pass. ``role`` names it."""
    rows = embedding_rows(model)
    if rows is None or rows >= len(tokenizer):
        return
    source = getattr(getattr(model, "config", None), "name_or_path", "")
    named = f"{role} ({source})" if source else role
    raise UsageError(
        f"{named} has {rows} token embeddings but the policy's tokenizer has {len(tokenizer)} "
        f"tokens (its pad {tokenizer.pad_token!r} is id {tokenizer.pad_token_id}), so ids from "
        f"{rows} on would index past them. Load it for that tokenizer, as rlhfkit's commands "
        "do (load_causal_lm(path, tokenizer=tokenizer), ValueModel.from_pretrained(path, "
        "tokenizer=tokenizer)), or call match_vocabulary(model, tokenizer) on it"
    )


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
    if gguf_file is None:
        check_model_source(name_or_path)
    with _loading(name_or_path, "model"):
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path,
            dtype=dtype,
            revision=revision,
            gguf_file=gguf_file,
            trust_remote_code=trust_remote_code,
            use_safetensors=_use_safetensors(),
        )
    hold_unverified_weights(model, name_or_path)
    if tokenizer is not None:
        match_vocabulary(model, tokenizer, f"model {str(name_or_path)!r}")
    return fuse_gelu(model)


def model_device(model: nn.Module) -> torch.device:
    """The device ``model``'s weights are on (its first parameter's)."""
    return next(model.parameters()).device


def stored_dtype(
    path_or_name: str | os.PathLike, revision: str | None = None
) -> torch.dtype | None:
    """The dtype a checkpoint's weights are stored in, as its ``config.json`` says (``dtype``,
    or the older ``torch_dtype``); None where there is no such file or field."""
    config_path = model_file(path_or_name, "config.json", revision)
    if config_path is None:
        return None
    config = json.loads(Path(config_path).read_text())
    name = config.get("dtype") or config.get("torch_dtype")
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    return dtype if isinstance(dtype, torch.dtype) else None


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
    role = "model"  # what errors call it
    fresh_head_random = True
    """Whether a fresh head starts small and random (a reward model's, lm-human-preferences:
    std 1 / sqrt(hidden + 1), scores near 0 but not tied) or at zero (a critic's)."""

    def __init__(self, backbone: nn.Module, *, per_token: bool | None = None):
        super().__init__()
        self.backbone = backbone
        self.per_token = self.default_per_token if per_token is None else per_token
        hidden = backbone.config.hidden_size
        self.score = nn.Linear(hidden, 1)
        if self.fresh_head_random:
            nn.init.normal_(self.score.weight, std=1.0 / math.sqrt(hidden + 1))
        else:
            nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    @property
    def config(self):
        return self.backbone.config

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

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
        tokenizer=None,
        dtype: torch.dtype = torch.float32,
        revision: str | None = None,
        trust_remote_code: bool = False,
    ):
        """Load a reward model with its trained head, or a plain (causal) LM with a fresh head;
        with ``tokenizer``, one that reads its ids (``match_vocabulary``).

        A reward model is a one-label sequence classifier (``reward_format``: what rlhfkit
        writes, and TRL and transformers) or rlhfkit's older backbone + ``score_head.*``.
        ``per_token=None`` keeps the class default, so ``ValueModel.from_pretrained(rm_dir)``
        turns a reward model checkpoint into a critic (InstructGPT's critic initialisation).
        """
        model = cls._load(path_or_name, per_token, dtype, revision, trust_remote_code)
        hold_unverified_weights(model, path_or_name)
        if tokenizer is not None:
            match_vocabulary(model, tokenizer, f"{cls.role} {str(path_or_name)!r}")
        return model

    @classmethod
    def _load(cls, path_or_name, per_token, dtype, revision, trust_remote_code):
        """``from_pretrained`` before the vocabulary is matched."""
        check_model_source(path_or_name)
        options = {"dtype": dtype, "revision": revision, "trust_remote_code": trust_remote_code}
        if is_sequence_classifier(path_or_name, revision):
            return cls._from_classifier(path_or_name, per_token, options)
        head_config = _read_head_config(path_or_name, revision)
        with _loading(path_or_name, "model"):
            backbone = _load_backbone(path_or_name, head_config, **options)
        model = cls(backbone, per_token=per_token)
        if head_config is None:
            logger.info(
                "%s is no reward model (neither a sequence classifier nor with %s); the score "
                "head is freshly initialised (%s)",
                path_or_name,
                HEAD_CONFIG,
                "small and random" if cls.fresh_head_random else "at zero",
            )
        else:
            state = load_file(model_file(path_or_name, HEAD_WEIGHTS, revision))
            model.score.load_state_dict(state)
        return model

    @classmethod
    def _from_classifier(cls, path_or_name, per_token: bool | None, options: dict):
        """A one-label sequence classifier with its head, bit for bit as rlhfkit saved it
        where ``score_bias.safetensors`` says how (``reward_format.restore_exact``)."""
        with _loading(path_or_name, "reward model"):
            backbone, head = load_sequence_classifier(
                path_or_name, use_safetensors=_use_safetensors(), **options
            )
        model = cls(fuse_gelu(backbone), per_token=per_token)  # draws the head's init as ever
        with torch.no_grad():
            model.score.weight.copy_(head.weight)
            if head.bias is None:  # transformers' heads have none; ours starts at 0
                model.score.bias.zero_()
            else:
                model.score.bias.copy_(head.bias)
        restore_exact(model, path_or_name, options["revision"])
        return model

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """rlhfkit's own format, which keeps a critic's ``per_token`` and a LoRA adapter: the
        backbone via its ``save_pretrained`` (safetensors), then the head next to it.
        ``RewardModel`` writes the standard format instead, where it can."""
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
    role = "reward model"

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """The standard format (``reward_format``): a one-label sequence classifier that
        ``AutoModelForSequenceClassification`` loads and scores as rlhfkit does. A LoRA model
        (a training checkpoint: the run's final model is merged) keeps rlhfkit's format, as
        does an architecture transformers has no sequence classifier for."""
        path = Path(save_directory)
        if isinstance(self.backbone, PeftModel):
            super().save_pretrained(path)
            return
        path.mkdir(parents=True, exist_ok=True)
        if not save_sequence_classifier(self.backbone, self.score, path):
            logger.warning(
                "transformers has no sequence classifier for model_type %r: %s is saved in "
                "rlhfkit's format (backbone + %s)",
                self.config.model_type,
                path,
                HEAD_WEIGHTS,
            )
            super().save_pretrained(path)


class ValueModel(ScalarHeadModel):
    """Values (B, T) at every token: the PPO critic.

    Started from a language model rather than a reward model, its head is zero, as
    lm-human-preferences' value head: every value starts at 0, so the first advantages are
    the returns themselves, not a random head's error (which whitening would make as large
    as any signal)."""

    default_per_token = True
    role = "critic"
    fresh_head_random = False


def is_reward_model(path_or_name: str | os.PathLike, revision: str | None = None) -> bool:
    """Whether ``path_or_name`` holds a trained reward model (a one-label sequence classifier,
    or rlhfkit's older backbone + head), not a model a fresh head would be put on."""
    if is_sequence_classifier(path_or_name, revision):
        return True
    return model_file(path_or_name, HEAD_CONFIG, revision) is not None


def _read_head_config(path_or_name: str | os.PathLike, revision: str | None) -> dict | None:
    config_path = model_file(path_or_name, HEAD_CONFIG, revision)
    if config_path is None:
        return None
    config = json.loads(Path(config_path).read_text())
    if config.get("format") != HEAD_FORMAT:
        raise ValueError(
            f"{config_path}: field 'format' is {config.get('format')!r}, expected {HEAD_FORMAT!r}"
        )
    return config


def _load_backbone(path_or_name, head_config, *, dtype, revision, trust_remote_code) -> nn.Module:
    if head_config is not None and head_config.get("lora"):
        # The directory holds only the adapter; the base weights come from where it says.
        base_path = PeftConfig.from_pretrained(path_or_name).base_model_name_or_path
        check_model_source(base_path, "LoRA base model")
        base = AutoModel.from_pretrained(
            base_path,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            use_safetensors=_use_safetensors(),
        )
        base = fuse_gelu(base)
        return PeftModel.from_pretrained(base, path_or_name, revision=revision, is_trainable=True)
    # For a causal LM checkpoint AutoModel keeps the base transformer and drops the LM head.
    backbone = AutoModel.from_pretrained(
        path_or_name,
        dtype=dtype,
        revision=revision,
        trust_remote_code=trust_remote_code,
        use_safetensors=_use_safetensors(),
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
