"""Loading, saving and running the models: causal LMs, scalar-head reward models and critics, LoRA, and their passes."""
