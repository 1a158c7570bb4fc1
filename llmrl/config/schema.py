"""Every setting of a run, as frozen dataclasses with their defaults, bounds and help text.

A key is addressed by its dotted path (`update.lr_actor`), in recipes (nested YAML) and in
`--set key=value` overrides alike. Field metadata drives validation (`choices`, `min`, `max`,
`gt`; `kind`: 'module' for a Python module name; `bool_words`: the (false, true) choices a YAML boolean stands for, so `on`/`off`/`true` work
for an 'auto'/'on'/'off' key) and the help text `llmrl train --help-config` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .domains import LR_MAX, SEED_MAX
from .memory import MemoryConfig


REJECTING_CORRECTIONS = ("token_mask", "seq_mask")
"""The `update.is_correction` choices that drop tokens (rows) from the batch rather than weight them
(llmrl/corrections.py: their `Correction.kept`); they need log π_old before the update."""


def opt(default: Any, help: str, **bounds: Any) -> Any:
    """A dataclass field with help text and validation bounds (choices/min/max/gt)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **bounds})
    return field(default=default, metadata={"help": help, **bounds})


def auto_switch(help: str) -> Any:
    """An 'auto' | 'on' | 'off' field (default 'auto'); YAML's true/false mean on/off."""
    return opt("auto", f"{help} (true/false mean on/off)", choices=("auto", "on", "off"), bool_words=("off", "on"))


@dataclass(frozen=True)
class ModelConfig:
    name: str = opt("tiny", "'tiny', 'tiny-tools' or 'tiny-guess' (built-in), a name from `llmrl models` (once `llmrl models get NAME` obtained it), a Hugging Face hub id, a local model folder or a .gguf file")
    dtype: str = opt("auto", "weights dtype; 'auto': the fastest on this hardware (bfloat16 on a GPU with it or a CPU "
                     "with AMX, but float32 for a model of hidden size under 256; on a CPU with avx512_bf16 alone, what a cached microbenchmark of the model's products "
                     "says; else float32; llmrl/config/precision.py)", choices=("auto", "float32", "bfloat16", "float16"))
    device: str = opt("cpu", "where to run", choices=("cpu", "cuda", "auto"))
    quantize: str = opt("none", "the frozen base's linear layers in 4 bits (bitsandbytes' nf4 or fp4, QLoRA's), shared by actor, critic "
                        "and reference; products in model.dtype; hf engine; pip install 'llmrl[quant]' (docs/quantized.md)", choices=("none", "nf4", "fp4"))
    attention: str = opt("auto", "attention kernel; 'auto': SDPA, with a bfloat16/float16 model's unpadded decoding steps on the CPU "
                         "sent down its packed grouped-head path (5x faster there than its enable_gqa one; "
                         "llmrl/models/attention.py)",
                         choices=("auto", "sdpa", "eager"))
    trust_remote_code: bool = opt(False, "let transformers run code shipped with the model")
    share_prompts: bool = opt(
        True, "run each distinct prompt once per forward and let all its samples attend to its key/value cache (when that "
        "saves at least half the prompt work, e.g. GRPO groups); same numbers up to float rounding; not in the update's "
        "gradient forwards with lora.dropout > 0 (each row draws its own dropout masks) or activation checkpointing")
    length_buckets: bool = opt(
        True, "run a batch's rows in groups of like response length, each trimmed of the padding its rows share, "
        "where that saves more positions than a forward call costs (llmrl/models/buckets.py); same numbers up to "
        "float rounding; not with dist.shard_base (its forwards are collectives every process runs alike)")
    logits_chunk_mib: float = opt(
        64.0, "float32 logits the log-prob forwards and the update hold at once, in MiB: the response positions "
        "run through the LM head in chunks that fit, and the backward recomputes a chunk instead of keeping it "
        "(at a 152k vocabulary a 32 x 64-token minibatch is 1.2 GB per copy unchunked); 0: the whole batch at once", min=0)


@dataclass(frozen=True)
class LoraConfig:
    r: int = opt(16, "LoRA rank of the actor and critic adapters", min=1)
    alpha: float = opt(32.0, "LoRA scaling numerator (scale = alpha / r)", gt=0)
    dropout: float = opt(
        0.0, "LoRA dropout probability, a regulariser of the update's gradient forwards only: rollouts, "
        "no-grad forwards, evaluation and export run without it", min=0, max=1,
    )
    target_modules: list[str] | None = opt(
        None, "module names to adapt; default: every linear layer except the LM head ('all-linear')"
    )
    modules_to_save: list[str] | None = opt(
        None, "modules trained in full inside each adapter (e.g. 'norm'); the reference keeps the originals; "
        "float32 master weights on a float16/bfloat16 base"
    )
    critic_layers: int | None = opt(
        None, "algorithms with a critic (ppo, a2c): put the critic's adapter on the top k decoder layers only, so its "
        "forward starts from the frozen base's hidden state entering layer L−k (captured from the reference forward "
        "when β > 0, else a no-grad base forward) and its backward stops there: the critic costs about k/L of a full "
        "one; null: every layer (ignored without a critic)", min=1,
    )
    critic_shortcut: bool = opt(True, "with lora.critic_layers: run the critic from the base's hidden state at layer L−k "
                                "(false: a full forward and backward through all layers, same values up to float rounding; for checks)")
    critic_from_reward: bool = opt(False, "start the critic's adapter and value head from the reward run in reward.functions "
                                   "on the actor's base (InstructGPT, DeepSpeed-Chat): its rank and target modules")


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = opt("hf", "generation engine: 'hf' decodes from the policy stack with its KV cache; 'vllm' samples "
                      "with a colocated vLLM engine synced after every update (engine.*, docs/engines.md)",
                      choices=("hf", "vllm"))
    prompts_per_step: int = opt(512, "B: prompts sampled per step", min=1)
    num_generations: int = opt(1, "G: responses per prompt (rows of a group are contiguous)", min=1)
    max_new_tokens: int = opt(5, "longest response in tokens", min=1)
    temperature: float = opt(1.0, "sampling temperature (the policy is softmax(logits / T))", gt=0)
    top_p: float = opt(1.0, "nucleus sampling mass; training refuses < 1, whose PPO ratio would not be the "
                       "sampler's (docs/algorithms.md)", gt=0, max=1)
    filter_groups: bool = opt(
        False, "dynamic sampling (DAPO): drop the groups whose G rewards are all equal (zero group advantage) "
        "before the forward and update, so no pass is spent on them; needs num_generations ≥ 2 (docs/algorithms.md)")
    filter_on: str = opt(
        "reward", "with filter_groups, what is compared within a group: 'reward' what the estimator sees (the "
        "score plus the overlong penalty), so every dropped group has zero advantage; 'score' the task's score "
        "alone, as DAPO's and verl's accuracy filter: a group of equal scores is dropped even when the overlong "
        "penalty differs, discarding its length signal", choices=("reward", "score"))
    max_draws: int = opt(
        0, "with filter_groups: at most this many extra rounds of prompts are generated to refill the batch "
        "to B informative groups (0: train on the groups left); logged as ds_draws", min=0)
    oversample: int = opt(
        0, "with filter_groups: generate this many more prompts beside the step's B in the first round's batch "
        "and keep the first B informative groups, the stream's first (verl's gen_batch_size > train_batch_size); "
        "one wider decode costs less than a refill round (rollout.max_draws); counted in ds_prompts", min=0)
    filter_scale: bool = opt(
        False, "with filter_groups: scale the actor's loss by the kept share of the batch, kept groups / B "
        "(logged as kept_share), as if the dropped groups were the zero-advantage rows they are; without a "
        "refill a step that keeps 1 group of 4 then moves the adapter about a quarter as far instead of a full "
        "AdamW step on G samples")
    generation_logprobs: bool = opt(
        True, "take log π_old of the drawn tokens from the decoding logits instead of a second no-grad "
        "forward of the actor (same float32 math; float16/bfloat16 models always use the forward)",
    )
    env: str | None = opt(
        None, "environment of multi-turn episodes: a built-in (calculator) or module:Class / file.py:Class; "
        "default: the task's own (task calc: calculator), none for a single-turn task (docs/environments.md)")
    max_turns: int = opt(4, "with an environment: at most this many assistant turns per episode", min=1, max=1000)
    max_episode_tokens: int | None = opt(
        None, "with an environment: an episode ends once its response (the model's and the environment's tokens "
        "after the prompt) reaches this many tokens; null: only max_turns × max_new_tokens bounds the model's part",
        min=1, max=1_000_000)
    tool_format: str = opt(
        "auto", "with a tool environment: how calls are read. hermes: <tool_call>{json}</tool_call>, tools offered via the "
        "chat template (or a system message); json: hermes, or in a turn without tags every JSON object with \"name\" and "
        "\"arguments\", bare or ```json-fenced (Qwen2.5-Coder's calls); plain: a turn ending in '=' calls the only tool, "
        "explained in a system message (for models that write no JSON); auto: the task's own format where it has one, else "
        "hermes with a chat template, plain without", choices=("auto", "hermes", "json", "plain"))
    tool_timeout_s: float = opt(5.0, "with a tool environment: seconds one tool call may run before it counts "
                                "as failed (the model reads the error)", gt=0, max=3600)
    env_timeout_s: float = opt(60.0, "with an environment: seconds one reset or step may run before the run stops "
                               "with a sentence naming the environment and the episode", gt=0, max=86400)


@dataclass(frozen=True)
class EstimatorConfig:
    name: str | None = opt(None, "advantage estimator; default: the algorithm's own")
    module: str | None = opt(None, "import this Python module first (it may register estimators)", kind="module")
    gamma: float = opt(1.0, "discount γ", min=0, max=1)
    lam: float = opt(0.95, "GAE λ", min=0, max=1)
    n_step: int = opt(3, "n of the A2C n-step return", min=1)
    whiten: bool = opt(False, "whiten advantages over the batch (masked mean 0, std 1)")


@dataclass(frozen=True)
class KLConfig:
    beta: float = opt(0.02, "KL coefficient β", min=0)
    estimator: str = opt("k1", "per-token KL estimator", choices=("k1", "k2", "k3"))
    placement: str = opt(
        "reward", "'reward': −β·KL_t shapes the rewards; 'loss': β·KL_t is added to the policy loss",
        choices=("reward", "loss"),
    )
    adaptive: bool = opt(False, "adapt β towards kl.target (Ziegler et al. 2019)")
    target: float = opt(0.1, "target KL per sequence for the adaptive controller", gt=0)
    horizon: int = opt(10000, "adaptive controller horizon in samples (β moves by at most 20 % a step)", min=1)


@dataclass(frozen=True)
class UpdateConfig:
    epochs: int = opt(1, "passes over each rollout batch", min=1)
    minibatch_size: int = opt(256, "rows per optimizer step", min=1)
    micro_batch_size: int | None = opt(None, "rows per forward/backward (gradient accumulation); default: the minibatch, or the rows whose activations fit (run/update_fit.py)", min=1)
    activation_checkpointing: bool = opt(
        False, "keep only each decoder layer's input in the update's gradient forwards and recompute the layer in "
        "the backward: about one layer's activations instead of all of them, for one more forward per pass "
        "(those forwards then run without prompt sharing)")
    lr_actor: float = opt(2e-5, "AdamW learning rate of the actor adapter", gt=0, max=LR_MAX)
    lr_critic: float = opt(1e-4, "AdamW learning rate of the critic adapter and value head", gt=0, max=LR_MAX)
    weight_decay: float = opt(0.0, "AdamW weight decay", min=0)
    lr_schedule: str = opt(
        "constant", "learning-rate factor over the run's steps (both roles): 'constant' 1; 'linear' "
        "(S − s)/(S − W) after warm-up, TRL's default; 'cosine' ½(1 + cos(π (s − W)/(S − W))); s = 0-based step, "
        "S = steps, W = update.warmup_steps",
        choices=("constant", "linear", "cosine"),
    )
    warmup_steps: int = opt(0, "steps of linear warm-up, (s + 1)/(W + 1), before update.lr_schedule", min=0)
    clip_eps: float = opt(0.2, "PPO ratio clip ε (low side)", min=0)
    clip_eps_high: float | None = opt(None, "upper ratio clip (clip-higher); default: clip_eps", min=0)
    dual_clip: float | None = opt(None, "dual-clip constant c > 1 for negative advantages", gt=1)
    value_clip: float | None = opt(0.2, "clip of V around V_old in the value loss; null: off", min=0)
    vf_coef: float = opt(0.5, "value loss scale", min=0)
    ent_coef: float = opt(0.0, "entropy bonus coefficient", min=0)
    max_grad_norm: float | None = opt(1.0, "gradient norm clip; null: off", gt=0)
    max_bad_steps: int = opt(3, "stop after this many steps in a row whose loss or gradient was not finite", min=1)
    on_policy_logprobs: str = auto_switch(
        "take log π_old from the update's own forward (ratio ≡ 1) instead of a separate no-grad forward "
        "in the rollout: one forward less, same numbers up to float rounding (with lora.dropout > 0 log π_old is "
        "that masked forward's); exact only for an on-policy update "
        "(update.epochs=1, update.minibatch_size = all rows of a step, no KL in the reward). 'auto': whenever the "
        "update is on-policy; 'on': require it; 'off': never"
    )
    on_policy_values: str = auto_switch(
        "take V_old(s_t) for the advantages from the critic's own update forward (run first, kept for its "
        "backward) instead of a separate no-grad critic forward in the rollout: one forward less, same numbers up to "
        "float rounding (with lora.dropout > 0 V_old is that masked forward's); only for one epoch of one minibatch of all rows without micro-batches. 'auto': whenever "
        "that holds; 'on': require it; 'off': never"
    )
    loss_agg: str = opt(
        "token-mean", "how per-token losses become one number",
        choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
    )
    policy_loss: str = opt(
        "ppo", "policy loss by name (see `llmrl losses`): ppo (clipped token ratio), gspo (clipped sequence ratio), "
        "cispo (clipped, stop-gradient IS weight), or one registered with @register_policy_loss in "
        "update.policy_loss_module; the clip range is update.clip_eps / clip_eps_high for each"
    )
    policy_loss_module: str | None = opt(None, "import this Python module first (it may register policy losses)",
                                         kind="module")
    is_correction: str = opt(
        "tis", "importance-sampling correction of each token's policy-gradient term when the engine's sampler μ is "
        "not the trainer's π_old (docs/engines.md), ρ_t = π_old/μ: off (w = 1), tis (w_t = min(ρ_t, C)), seq_tis "
        "(w_i = min(Π_t ρ_t, C) per sequence), token_mask (w_t = 1 if ρ_t in update.is_band else 0), seq_mask "
        "(w_i = 1 if the geometric mean of the row's ρ_t is in update.is_band else 0); no effect when log π_old "
        "comes from the sampler's own decoding (the hf engine)",
        choices=("off", "tis", "seq_tis", "token_mask", "seq_mask"),
    )
    is_clip: float = opt(2.0, "C, the cap of the tis and seq_tis weights", min=1)
    is_band: list[float] = opt(
        [0.5, 2.0], "low, high: token_mask and seq_mask keep a token (a sequence) whose ratio π_old/μ lies in "
        "low ≤ ρ ≤ high (0 < low < 1 < high)"
    )
    mask_truncated: bool = opt(
        False, "leave completions that hit rollout.max_new_tokens without EOS out of the policy and value losses "
        "(DAPO's overlong filtering); their rewards still count in the advantages of their group"
    )


@dataclass(frozen=True)
class EvalConfig:
    size: int = opt(500, "held-out prompts scored by greedy decoding (0: skip)", min=0)
    every: int = opt(100, "also evaluate every N steps (0: only before and after)", min=0)
    batch_size: int = opt(256, "prompts per evaluation batch", min=1)


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = opt(100, "save a checkpoint every N steps (0: only at the end and on interrupt)", min=0)
    keep: int = opt(2, "how many recent checkpoints to keep", min=1)


@dataclass(frozen=True)
class LogConfig:
    report_to: list[str] = opt(
        [], "also send scalar metrics to these trackers: tensorboard (RUN/tensorboard), wandb",
        each=("tensorboard", "wandb"),
    )
    completions_every: int = opt(
        50, "every N steps (and at step 1) write sample rows to completions.jsonl and show a few (0: off)", min=0
    )
    completions_rows: int = opt(8, "prompt/completion/reward rows logged per such step (the batch's first rows)", min=1)


@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = opt(
        None, "prompts from a local .jsonl/.csv/.parquet file or a `datasets` hub name (used instead of `task`)"
    )
    split: str = opt("train", "split of a hub dataset to train on")
    eval_dataset: str | None = opt(None, "held-out prompts from this file or hub name; default: hold out data.eval_fraction")
    eval_fraction: float = opt(0.1, "share of the dataset held out for evaluation when no eval_dataset is given", min=0, max=0.9)
    split_seed: int = opt(1234, "seed of the fixed train/eval shuffle (independent of the run's seed)", min=0,
                          max=SEED_MAX)
    prompt_column: str = opt("prompt", "column holding the prompt: a string or a list of {role, content} messages")
    max_rows: int | None = opt(None, "use only the first N rows of the dataset (and of eval_dataset)", min=1)
    chat_template: str = auto_switch(
        "'auto': apply the tokenizer's chat template when it has one; 'on': require one; 'off': raw text prompts"
    )
    system_prompt: str | None = opt(
        None, "a system message put first in each prompt without one (needs a chat template); null: the template's own "
        "(Qwen2.5: 'You are Qwen, created by Alibaba Cloud. …'); '': an empty one; environments' openings unchanged", kind="prose")


@dataclass(frozen=True)
class RewardConfig:
    functions: list[dict[str, Any]] | None = opt(None, "rewards summed with weights, e.g. [{name: numeric, weight: 1.0}, {name: my.mod:fn, weight: 0.5}, "
        "{model: reward-model-folder, weight: 0.2}]; names: exact_match, numeric, first_number, math, format, length_penalty, "
        "module:function, file.py:function; a model: a classifier folder, or a reward run (`llmrl reward train`; on the "
        "actor's base a fourth role); default: the task's own reward",
    )
    success: float = opt(1.0, "with reward.functions: a completion counts as correct when its total reward ≥ this")
    batch_size: int = opt(16, "completions per forward pass of a reward model", min=1)
    overlong_buffer: float | None = opt(
        None, "DAPO's soft overlong punishment: the last share of rollout.max_new_tokens (L_cache = share · L_max) over "
        "which the trained reward falls linearly from 0 to −reward.overlong_penalty at L_max tokens (EOS counted); "
        "null: off", gt=0, max=1,
    )
    overlong_penalty: float = opt(1.0, "the penalty at L_max tokens of reward.overlong_buffer", min=0)


@dataclass(frozen=True)
class RGConfig:
    """reasoning-gym tasks (`task: rg:NAME`; llmrl/tasks/rg.py, docs/tasks.md)."""

    config: dict | None = opt(None, "the generator's settings of task rg:NAME, e.g. {max_animals: 4} (the same as "
                              "rg:NAME?max_animals=4, whose own settings win); `llmrl tasks rg:NAME` lists them")
    train_size: int = opt(1000, "questions generated for training (per mixture: shared by weight); a train question "
                          "equal to a held-out one is dropped", min=1, max=10**6)
    eval_size: int | None = opt(None, "held-out questions generated, from seeds disjoint from the train ones (a train "
                                "question equal to one of them is dropped); default: eval.size, the ones a run scores. "
                                "Item i is the same whatever the size, so the held-out set is fixed by (task, its "
                                "settings, data.split_seed) and a run scores its first eval.size", min=1, max=10**5)
    reward: str = opt("strict", "what trains: 'strict' reasoning-gym's score of the answer rg.answer reads (partial credit "
                      "included); 'exact' 1 where that score is full, else 0; 'lenient' the best score of the looser readings "
                      "(tag, last line cleaned, last number); 'both' the mean of strict and lenient; accuracies reported either "
                      "way", choices=("strict", "exact", "lenient", "both"))
    answer: str = opt("tag", "the answer convention the prompt states and strict accuracy reads: 'tag' the last "
                      "<answer>…</answer> (reasoning-gym's own); 'line' the last non-empty line, as it is (a small model "
                      "that never writes the tags still earns partial credit there: docs/tasks.md)",
                      choices=("tag", "line"))


@dataclass(frozen=True)
class MixConfig:
    tasks: list[dict[str, Any]] | None = opt(
        None, "with task: mix, several tasks in one run: [{name: rg:NAME, weight: 2, config: {...}}, {name: chat_sum}]; "
        "task k gets a share w_k/Σw of the train prompts, and evaluations report the held-out accuracy per task")


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the generation engines: the first three are the `hf` engine's, the rest the `vllm` engine's."""

    merge_lora: bool = opt(True, "hf engine: decode the actor through its weights with the LoRA merged in (W + s·B·A, one product "
                           "per layer instead of three), built before each generation and freed after; off: through the adapters "
                           "(models/merged.py); a 4-bit base's W is deq(W_q) on the CPU")
    pack_weights: bool = opt(True, "hf engine on the CPU: decode through copies of the linear weights laid out for oneDNN's kernel "
                             "(1.2-1.8x per decoding product), made before each generation and freed after; models of hidden size "
                             ">= 256 (models/packed.py); a 4-bit base's de-quantised (both off: decoding on its 4-bit layers)")
    drop_finished: bool = opt(True, "hf engine: a row that has drawn its stop token leaves the decoding batch (its KV-cache rows "
                              "dropped), so the rows still writing no longer carry it; off: finished rows are fed pads until "
                              "the longest answer ends (engines/hf_decode.py); always off with dist.shard_base")
    sync: str = opt(
        "merged", "how the actor reaches the engine after each update: 'merged' pushes W + s·B·A of the adapted "
        "layers (and trained modules_to_save) into its weights; 'adapter' serves the LoRA adapter as a LoRA request "
        "(one base in memory; slower kernels, on the CPU especially)", choices=("merged", "adapter"),
    )
    dtype: str | None = opt(None, "the engine's dtype; default: the model's (model.dtype); 'auto': the fastest on "
                            "this hardware", choices=("auto", "float32", "bfloat16", "float16"))
    gpu_memory_utilization: float = opt(
        0.3, "on a GPU: the share of its memory the engine takes for weights and KV cache (the trainer needs the rest)",
        gt=0, max=1,
    )
    kv_cache_gb: float | None = opt(None, "on the CPU: GiB of KV cache the engine allocates; default: sized to the run, "
                                    "1.25 × its rows at once × (longest prompt + max_new_tokens) (engines/vllm_memory.py)",
                                    gt=0)
    max_model_len: int | None = opt(None, "longest prompt + response (tokens) the engine serves; default: the run's "
                                    "longest prompt + rollout.max_new_tokens", min=1)
    max_num_seqs: int = opt(256, "most sequences the engine decodes at once", min=1)
    enforce_eager: bool | None = opt(None, "run without CUDA graphs or compilation; default: true on the CPU, false "
                                     "on a GPU")
    sleep: bool = opt(False, "on a GPU: offload the engine's weights and drop its KV cache during the update "
                      "(vLLM sleep level 1), waking it for the sync")
    prefix_caching: bool = opt(True, "reuse the KV cache of a prompt for the other samples of its group")


@dataclass(frozen=True)
class DistConfig:
    timeout_s: float = opt(600.0, "torchrun runs: seconds a process waits for the others in a collective before the "
                           "run stops", gt=0)
    shard_base: bool = opt(False, "torchrun runs: shard the frozen base model's decoder layers over the processes "
                           "with FSDP2 (fully_shard)")


@dataclass(frozen=True)
class Config:
    algo: str = opt("ppo", "algorithm preset (see `llmrl algos`)")
    task: str = opt("arithmetic", "task providing prompts and a reward: arithmetic, chat_sum, calc, chat_calc, chat_calc_tools, chat_calc_json, guess, ta:ENV_ID (TextArena), rg:NAME[?key=value&…] "
                    "(reasoning-gym), A,B,… (a mixture, equal weights) or mix (mix.tasks); `llmrl tasks` lists them")
    seed: int = opt(0, "seed of every random choice in the run (at most 2^32 − 1: numpy's seeds, which vLLM "
                    "uses; seed·7919 + epoch then fits torch's 64-bit generators)", min=0, max=SEED_MAX)
    steps: int = opt(400, "training steps (one rollout batch each)", min=1)
    out: str | None = opt(None, "run folder; default: runs/<algo>-<task>-<time>")
    threads: int | None = opt(None, "torch CPU threads; default: torch's choice (at most the machine's CPUs: "
                              "more threads than cores only wait on each other)", min=1, max=1024)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rg: RGConfig = field(default_factory=RGConfig)
    mix: MixConfig = field(default_factory=MixConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
