"""Reward models trained from preference pairs (`llmrl reward train`): a LoRA adapter and a score head on
the run's base, the Bradley–Terry loss, the reward run folder; and preference pairs made from a verifier."""
