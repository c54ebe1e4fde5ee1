"""rlhfkit: the InstructGPT RLHF pipeline on Hugging Face causal language models.

SFT -> reward model -> PPO (Ouyang et al. 2022), with DPO, GRPO/RLOO and best-of-n beside it.
The math lives in :mod:`rlhfkit.ops` as small pure functions; everything else is plumbing
around them. See ``docs/`` and the README for a tour.
"""

__version__ = "0.1.0"
