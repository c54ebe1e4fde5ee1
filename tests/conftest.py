"""Shared test fixtures: a tiny byte-level BPE tokenizer and a tiny GPT-2 built from a config.

Everything is made in-process and offline, so the suite never touches the Hugging Face hub.
Fixtures are session-scoped because building them is the slowest part of many tests; tests
that mutate a model must ask for ``tiny_model`` (a fresh load) rather than share one.
"""

import json
import os

# Set before transformers/datasets are imported anywhere, so nothing tries the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import random  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from rlhfkit.experience.scorers import Scorer  # noqa: E402

# The test models are tiny: a second thread costs more in synchronisation than it saves, and
# on a busy machine it makes each forward many times slower (measured: 440 ms vs 5.5 ms).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``cuda`` where there is no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request) -> torch.device:
    """Each device a test runs on: the CPU always, a CUDA GPU where there is one."""
    return torch.device(request.param)


@pytest.fixture
def two_threads():
    """Two intra-op threads for one test (the parallel paths need a thread per model)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
TINY_VOCAB_SIZE = 400

_SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "a small bird", "the robot", "we"]
_VERBS = ["likes", "sees", "finds", "makes", "wants", "reads", "paints", "helps"]
_OBJECTS = ["a red ball", "the big tree", "some good food", "a new book", "the blue sky", "it"]
_ENDINGS = [".", "!", " today.", " every day.", " in the park.", "?"]


def tiny_corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    """Simple English sentences, deterministic for a given seed."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        words = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
        lines.append(f"{words.capitalize()}{rng.choice(_ENDINGS)} Number {i % 50}.")
    return lines


def build_tiny_tokenizer(
    vocab_size: int = TINY_VOCAB_SIZE, pad_is_eos: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (GPT-2 style) on ``tiny_corpus`` in well under a second; with
    ``pad_is_eos`` EOS is its only special token and its pad, as many hub tokenizers have."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN] if pad_is_eos else [EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN if pad_is_eos else PAD_TOKEN,
        model_max_length=128,
    )


def tiny_lm(tokenizer, seed: int = 0, n_positions: int = 64) -> GPT2LMHeadModel:
    """A fresh seeded 2-layer GPT-2 (n_embd 64) over ``tokenizer``'s vocabulary."""
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=64,
        n_positions=n_positions,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


def tiny_llama(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    """A fresh seeded 1-layer Llama over ``tokenizer``'s vocabulary: a final RMSNorm, no bias."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def write_jsonl(path, rows: list[dict]) -> None:
    """``rows`` as JSON lines at ``path``, its directory made if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_pipeline_data(root) -> None:
    """prompts/, sft/ and comparisons/ with train and test files, as the demo data has: the
    first 3 words of a tiny-corpus line as the prompt, the rest as the response."""
    lines = tiny_corpus(60, seed=3)
    for split, chunk in (("train", lines[:44]), ("test", lines[44:])):
        cut = [(" ".join(s.split()[:3]), " " + " ".join(s.split()[3:])) for s in chunk]
        write_jsonl(root / "prompts" / f"{split}.jsonl", [{"prompt": p} for p, _ in cut])
        write_jsonl(root / "sft" / f"{split}.jsonl", [{"prompt": p, "response": r} for p, r in cut])
        pairs = [
            {"prompt": p, "chosen": r, "rejected": other}
            for (p, r), (_, other) in zip(cut, cut[1:] + cut[:1], strict=True)
        ]
        write_jsonl(root / "comparisons" / f"{split}.jsonl", pairs)


def tiny_prompts(tokenizer, n: int = 64) -> list[list[int]]:
    """``n`` prompts of at most 6 token ids from the tiny corpus."""
    return [tokenizer(line)["input_ids"][:6] for line in tiny_corpus(n)]


TARGETS = range(10, 50)  # 40 of ~400 token ids: about 10% of random tokens hit at the start


class TargetFraction(Scorer):
    """Share of the response's real tokens that are ``TARGETS`` ids (a trivially learnable
    reward for the RL trainers); remembers the last batch it scored."""

    name = "target_fraction"

    def score(self, batch):
        self.last = batch
        real = batch.response_mask != 0
        hits = (batch.response >= TARGETS.start) & (batch.response < TARGETS.stop) & real
        return hits.sum(1).float() / real.sum(1)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """Directory holding the tiny tokenizer, loadable with ``AutoTokenizer.from_pretrained``."""
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    """The tiny tokenizer loaded back from disk (so tests see what users would load)."""
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A seeded 2-layer GPT-2 (n_embd 64) saved together with the tiny tokenizer."""
    path = tmp_path_factory.mktemp("tiny_model")
    model = tiny_lm(tiny_tokenizer, n_positions=128)
    model.generation_config.pad_token_id = tiny_tokenizer.pad_token_id
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def tiny_model(tiny_model_dir):
    """A fresh load of the tiny GPT-2 (function-scoped, safe to train or mutate)."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)
