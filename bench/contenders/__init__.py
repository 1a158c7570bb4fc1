"""The contenders of bench/vs_trl.py, one module each, and what they share; vs_trl.py is the runner
that alternates them (one subprocess per contender and repetition) and tabulates the results.

    shared.py         the issue-8 configuration (model, LoRA, batch, β, lr, seed), the run's threads and
                      device, and the helpers every child uses (peak RSS, GPU sync, llmrl's overrides,
                      the prompt order TRL is given)
    llmrl_run.py      llmrl's own trainer: the llmrl-* contenders (GRPO, RLOO, PPO, the vLLM engine)
    trl_grpo.py       TRL 1.16's GRPOTrainer / RLOOTrainer (trl-grpo, trl-rloo, trl-grpo-vllm)
    trl_ppo.py        TRL 1.12's PPOTrainer (trl-ppo; `python -m bench.trl_ppo` runs it alone)
    vllm_generate.py  plain vLLM `LLM.generate` against llmrl's vllm engine (vllm-generate)
    bound.py          the floor of a GRPO step, piece by piece (bound)
    report.py         the table: medians, ratios, the printed summary

No module here imports bench/vs_trl.py; each contender imports only `shared` (tests/test_layout.py
refuses an import circle).
"""
