"""Generation engines: prompts in, sampled token ids (and behaviour log-probs) out."""
