"""A run: session setup, the loop, its folder, checkpoints, metrics, summary and evaluation."""
