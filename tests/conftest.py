"""Shared test fixtures: a tiny byte-level BPE tokenizer and a tiny GPT-2, saved and loaded as
users would, the device a test runs on and its thread count.

Everything is made in-process and offline, so the suite never touches the Hugging Face hub.
Fixtures are session-scoped because building them is the slowest part of many tests; tests
that mutate a model must ask for ``tiny_model`` (a fresh load) rather than share one. The plain
functions and classes these are built from (the tiny corpus, tokenizer and models, JSONL
writers, a test scorer) are in ``helpers.py``, which tests import.
"""

import os

# Set before transformers/datasets are imported anywhere, so nothing tries the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from helpers import build_tiny_tokenizer, tiny_lm  # noqa: E402

# The commands the tests start in processes of their own run on torch's own thread count, as
# the tests compare them with each other bit for bit: not on one chosen by the machine's load
# at each start (runtime/threads.py).
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
# The test models are tiny: a second thread costs more in synchronisation than it saves, and on
# a busy machine it makes each forward many times slower (figures in docs/results/ppo.md,
# "One torch thread for the test suite").
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread():
    """Every test starts on one intra-op thread, whatever the one before it left."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
