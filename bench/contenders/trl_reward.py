"""TRL 1.16.0's RewardTrainer (the `[bench]` extra) on a reward recipe's pairs, base, LoRA and schedule, for
docs/reward-models.md's row against `llmrl reward train` (run the two alternately, alone):

    python -m bench.contenders.trl_reward --recipe recipes/smollm2-135m-reward.yaml [--set rm.epochs=1]

llmrl's loader reads the recipe, so both take the same settings: float32 AutoModelForSequenceClassification
(1 label), peft LoRA r/α/targets ('all-linear'), dropout 0 (TRL disables the model's), batch, epochs, lr with
linear decay, no warm-up, clip 1.0, AdamW, seed; TRL formats the pairs itself. Prints one JSON line: held-out
accuracy before → after (trainer.evaluate), trainer.train's seconds, the process's seconds and peak RSS."""

import argparse, json, resource, tempfile, time

START = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--set", action="append", default=[])
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import RewardConfig, RewardTrainer, __version__
    from llmrl.config.reward_run import load_reward_config
    from llmrl.models.load import model_source
    cfg = load_reward_config(ap.parse_args().recipe, sets=ap.parse_args().set)
    torch.set_num_threads(cfg.threads or torch.get_num_threads())
    pairs = load_dataset("json", data_files={"train": cfg.pairs.dataset, "test": cfg.pairs.eval_dataset})
    pairs = pairs.remove_columns([c for c in pairs["train"].column_names if c not in ("prompt", "chosen", "rejected", "margin")])
    rm = cfg.rm
    args = RewardConfig(output_dir=tempfile.mkdtemp(prefix="trl-rm-"), per_device_train_batch_size=rm.batch_size,
                        per_device_eval_batch_size=rm.eval_batch_size, num_train_epochs=rm.epochs, learning_rate=rm.lr,
                        lr_scheduler_type=rm.lr_schedule, warmup_steps=0, weight_decay=rm.weight_decay, max_grad_norm=rm.max_grad_norm,
                        seed=cfg.seed, use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=10,
                        max_length=None, model_init_kwargs={"dtype": torch.float32})
    lora = LoraConfig(task_type="SEQ_CLS", r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=0.0,
                      target_modules=cfg.lora.target_modules or "all-linear")
    trainer = RewardTrainer(model=model_source(cfg.model)[0], args=args, train_dataset=pairs["train"],
                            eval_dataset=pairs["test"], peft_config=lora)
    before, train_s = trainer.evaluate()["eval_accuracy"], trainer.train().metrics["train_runtime"]
    print(json.dumps({"trl": __version__, "accuracy_before": before, "accuracy_after": trainer.evaluate()["eval_accuracy"],
                      "train_s": train_s, "steps": trainer.state.global_step, "seconds": round(time.perf_counter() - START, 1),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


if __name__ == "__main__":
    main()
