"""Run-directory infrastructure: resolved config, metrics (JSONL + TensorBoard), plots, checkpoints."""
