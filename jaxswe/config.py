"""Typed run configuration: one YAML file per runnable setup, validated by pydantic.

A config file holds named sections (model, optimizer, mesh, rollout, env, agent, sft, rft, rl,
eval) plus the list of stages a pipeline runs. `load_config(path, overrides)` reads the YAML,
applies `section.key=value` overrides (values parsed as YAML scalars) and validates the whole.
Any problem (missing file, bad YAML, unknown key, wrong type) raises `ConfigError` whose message
is one line naming the file and the key.
"""

from __future__ import annotations

import copy
import difflib
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jaxswe.errors import UserError
from jaxswe.packing import ROW_BUCKET_RATIO


class ConfigError(UserError):
    """A config file or override that cannot be used; the message is one line for the user."""


class Section(BaseModel):
    """Base of every config section: frozen, and unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(Section):
    """The policy model: where its weights come from and how it computes."""

    path: str | None = None  # Hugging Face directory or Orbax checkpoint; None with `preset`
    preset: str | None = None  # a named shape from jaxswe.model presets (random init)
    tokenizer: str | None = None  # directory with tokenizer files; defaults to `path`
    dtype: Literal["float32", "bfloat16"] = "bfloat16"  # compute dtype of the forward and backward passes
    # dtype the master weights and optimizer state are kept in
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    # activation recomputation in the backward pass (memory for compute)
    remat: Literal["none", "full", "save_projections"] = "full"
    # auto (fused Pallas on NVIDIA GPUs, else blockwise) | blockwise | pallas | dense | cudnn; used
    # by the train step, the recompute pass and the embedded engine (see docs/guide.md)
    attention: Literal["auto", "blockwise", "pallas", "dense", "cudnn"] = "auto"
    attention_block: int = Field(512, gt=0)  # block length of blockwise / Pallas attention
    logprob_chunk: int = Field(1024, gt=0)  # ~ logprob_chunk x vocab float32 logits per device at a time
    max_context: int = Field(65536, gt=0)  # longest sequence the model serves and trains on (tokens)
    rope_scaling: dict[str, Any] | None = None  # e.g. {rope_type: yarn, factor: 4.0, ...}
    overrides: dict[str, Any] = Field(default_factory=dict)  # Qwen2Config fields over `preset`
    seed: int = 0  # random init's seed (with `preset`)


class OptimizerSection(Section):
    """AdamW with warm-up, cosine-to-zero (or constant) schedule and global-norm clipping."""

    lr: float = Field(1e-6, gt=0)  # peak learning rate
    b1: float = Field(0.9, ge=0, lt=1)  # AdamW beta1
    b2: float = Field(0.999, ge=0, lt=1)  # AdamW beta2
    eps: float = Field(1e-8, gt=0)  # AdamW epsilon
    weight_decay: float = Field(0.1, ge=0)  # AdamW decoupled weight decay (see decay_skip)
    # groups exempt from weight decay. Default: RMSNorm scales and q/k/v biases, as Megatron-LM and
    # the transformers Trainer do (decay pulls a norm scale toward 0, i.e. shrinks activations, and
    # regularizes nothing); embeddings are decayed like any matrix unless "embeddings" is listed.
    decay_skip: list[Literal["norms", "biases", "embeddings"]] = Field(
        default_factory=lambda: ["norms", "biases"]
    )
    warmup_steps: int = Field(0, ge=0)  # linear warm-up from 0 over this many optimizer steps
    # after warm-up: constant, or cosine to 0 at total_steps
    schedule: Literal["cosine", "constant"] = "constant"
    total_steps: int | None = Field(None, gt=0)  # required for cosine
    grad_clip: float | None = Field(1.0, gt=0)  # global-norm gradient clipping; None: off
    micro_batches: int = Field(1, gt=0)  # gradient accumulation: micro-batches per optimizer step
    # Token-budget batching: rows per row shard in one micro-batch; the micro-batch count then
    # follows each step's packed row count instead of `micro_batches`.
    micro_batch_rows: int | None = Field(None, gt=0)
    # dtype the weight gradients are formed and reduced across devices in (FSDP's reduce-scatter)
    # when model.dtype is bfloat16: float32 doubles that traffic; bfloat16 rounds every partial sum
    grad_reduce_dtype: Literal["float32", "bfloat16"] = "float32"

    @model_validator(mode="after")
    def _cosine_needs_total(self) -> OptimizerSection:
        if self.schedule == "cosine" and self.total_steps is None:
            raise ValueError("schedule 'cosine' needs total_steps")
        return self


class MeshSection(Section):
    """Device mesh axis sizes (-1 takes the remaining devices) and logical-axis rules."""

    # mesh axis sizes (data, fsdp, context, tensor); -1 takes the remaining devices
    axes: dict[str, int] = Field(default_factory=lambda: {"data": 1, "fsdp": -1, "context": 1, "tensor": 1})
    # one process only: the trainer's mesh spans this many of its first devices (None: all). On GPUs
    # give the trainer its GPUs with CUDA_VISIBLE_DEVICES instead: JAX claims memory on every GPU it sees
    devices: int | None = Field(None, gt=0)
    rules: dict[str, str | list[str] | None] | None = None  # logical name -> mesh axis; None = defaults
    # attention across the context axis: ring (blocks passed round) or all-gather
    context_attention: Literal["ring", "allgather"] = "ring"
    gpu_memory_gb: float = Field(141.0, gt=0)  # GPU memory per device, for `jaxswe plan` (H200: 141)
    num_hosts: int = Field(1, gt=0)  # hosts of the job, for `jaxswe plan` and memory estimates
    devices_per_host: int = Field(8, gt=0)  # GPUs per host; `jaxswe plan` sizes -1 axes with it
    memory_headroom: float = Field(0.1, ge=0, lt=1)  # fraction of GPU memory kept free by the planner
    peak_tflops: float = Field(989.0, gt=0)  # dense bf16 peak per GPU (H200), for step-time estimates
    mfu: float = Field(0.4, gt=0, le=1)  # assumed model FLOPs utilization for step-time estimates


class RolloutSection(Section):
    """Rollout engine and sampling. RL sampling must be unbiased unless `allow_biased_sampling`."""

    # embedded (in-process JAX sampler), http (running servers at urls), sglang (launched)
    engine: Literal["embedded", "http", "sglang"] = "embedded"
    urls: list[str] = Field(default_factory=list)  # http: every worker (weight updates, flushes, health)
    router: str | None = None  # sglang-router URL: generation goes there, control to each of `urls`
    export_dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"  # weights handed to servers
    host: str = "127.0.0.1"  # embedded server's address
    port: int = Field(30000, ge=0, lt=65536)  # embedded server port; 0 picks a free one
    temperature: float = Field(1.0, ge=0)  # sampling temperature of training rollouts (eval has its own)
    top_p: float = Field(1.0, gt=0, le=1)  # nucleus sampling; RL needs 1.0 unless allow_biased_sampling
    top_k: int = -1  # top-k sampling, -1 off; RL needs -1 unless allow_biased_sampling
    min_p: float = Field(0.0, ge=0, le=1)  # min-p sampling, 0 off; RL needs 0 unless allow_biased_sampling
    max_new_tokens: int = Field(1024, gt=0)  # most tokens one model turn may generate
    allow_biased_sampling: bool = False  # let RL sample with top_p/top_k/min_p (biased gradients)
    request_timeout_s: float = Field(600.0, gt=0)  # seconds one generation request may take
    max_retries: int = Field(3, ge=0)  # retries of a failed generation request (with backoff)
    max_batch: int = Field(16, gt=0)  # embedded engine: most requests batched into one forward pass
    tensor_parallel: int = Field(1, gt=0)  # sglang launcher
    mem_fraction: float = Field(0.85, gt=0, le=1)  # sglang launcher
    # sglang launcher: --enable-deterministic-inference, without which SGLang ignores sampling seeds;
    # embedded: batches of one prompt bucket, so timing and load never change a request's numbers
    deterministic_inference: bool = True
    seed: int = 0  # base of the per-request sampling seeds


class DockerHostSection(Section):
    """One Docker engine of the sandbox pool (envs.provision.engines); a bare URL string is accepted too."""

    url: str = "default"  # unix:///path, tcp://host:2376 (TLS below), ssh://user@host, or "default"
    capacity: int = Field(8, gt=0)  # the most sandboxes this trainer process keeps on it at once
    name: str = ""  # shown in messages and metrics; default: the URL
    tls_verify: bool = True  # tcp://: verify the engine's certificate
    tls_ca: str | None = None  # tcp:// with TLS: the CA that signed the engine's certificate
    tls_cert: str | None = None  # client certificate and key (the engine's --tlsverify)
    tls_key: str | None = None  # the client key for tls_cert

    @model_validator(mode="before")
    @classmethod
    def _from_url(cls, data: Any) -> Any:
        return {"url": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _known_scheme(self) -> DockerHostSection:
        if self.url != "default" and not self.url.startswith(("unix://", "tcp://", "ssh://")):
            raise ValueError(f"{self.url!r}: expected unix://, tcp://, ssh:// or default")
        return self


class EnvSection(Section):
    """Where tasks come from and where their commands run."""

    tasks: str = "builtin"  # "builtin", a JSON/JSONL path, or "toy" (the RL smoke test, jaxswe/stages/toy.py)
    eval_tasks: str | None = None  # defaults to `tasks`
    # where task commands run: local (bubblewrap sandbox + task venv) or docker
    backend: Literal["local", "docker"] = "local"
    command_timeout_s: float = Field(60.0, gt=0)  # seconds one agent command may run
    test_timeout_s: float = Field(600.0, gt=0)  # grading: one whole test run
    test_case_timeout_s: float = Field(120.0, gt=0)  # grading: one test's call phase (pytest)
    # a command's output shown to the model is cut to this many characters
    output_limit_chars: int = Field(8000, gt=0)
    max_parallel: int = Field(8, gt=0)  # episodes (sandboxes) run at once
    memory_limit: str = "2g"  # docker: memory limit per sandbox
    # backend docker: the engines sandboxes are placed on (least loaded with a free slot; dead ones
    # skipped until they answer again). Empty: the one engine of DOCKER_HOST, no pool.
    docker_hosts: list[DockerHostSection] = Field(default_factory=list)
    docker_health_interval_s: float = Field(10.0, gt=0)  # how often each engine is pinged
    cpu_limit: float = Field(0.5, gt=0)  # docker: CPUs per sandbox
    pids_limit: int = Field(256, gt=0)  # docker: processes per sandbox
    allow_unisolated: bool = False  # run model commands on the host when bwrap is missing (local)
    toy_values: int = Field(2, ge=2, le=100)  # tasks "toy": the key's possible values
    toy_tasks: int = Field(16, gt=0)  # tasks "toy": task ids in the pool

    @field_validator("tasks", "eval_tasks")
    @classmethod
    def _task_file_absolute(cls, source: str | None) -> str | None:
        """A task file's path made absolute: the run dir's config.yaml names it from any working dir."""
        return source if source in (None, "builtin", "toy") else str(Path(source).absolute())


class AgentSection(Section):
    """The scaffold: prompts and episode limits."""

    prompts: str = "default"  # a name in jaxswe/prompts or a YAML path
    max_turns: int = Field(40, gt=0)  # an episode ends after this many model turns
    # an episode ends when its context would exceed this many tokens
    max_context_tokens: int = Field(65536, gt=0)
    window_lines: int = Field(100, gt=0)  # lines the file viewer shows at once
    demonstration: bool = False  # one-shot demo in the prompt (first RFT round only)
    # the paper trains without it: episodes keep the demo-free prompt unless this is set
    demonstration_in_trained_prompt: bool = False


class SFTSection(Section):
    """Supervised training on trajectories (warm start and RFT)."""

    epochs: float = Field(1.0, gt=0)  # passes over the trajectories (a fraction: part of one)
    batch_size: int = Field(64, gt=0)  # trajectories per optimizer step
    max_steps: int | None = Field(None, gt=0)  # cap; the paper's RFT "50 steps" is max_steps: 50
    seq_len: int = Field(65536, gt=0)  # packed row length
    checkpoint_every: int | None = Field(25, gt=0)  # RFT: Orbax checkpoint every N steps (resumable)


class WarmStartSection(Section):
    """Stand-in for a pretrained base model in the CPU demo: a tokenizer trained on the tasks' texts,
    a small random model, and SFT on scripted gold-command demonstrations run through the agent loop."""

    steps: int = Field(200, gt=0)  # SFT steps on the demonstrations
    batch_size: int = Field(8, gt=0)  # demonstrations per SFT step
    lr: float = Field(3e-3, gt=0)  # the warm start's learning rate
    vocab_size: int = Field(1024, gt=0)  # tokenizer built when model.tokenizer is not set
    model_overrides: dict[str, Any] = Field(default_factory=dict)  # Qwen2Config fields over model.preset
    # also SFT on a decoy of each demonstration (the same edits writing back the old lines, then
    # submit: a near miss that fails the tests), so the warm start holds a real choice per task
    decoys: bool = False


class RFTSection(Section):
    """Rejection fine-tuning: sample N per task, keep resolved, SFT."""

    samples_per_task: int = Field(10, gt=0)  # episodes sampled per task; the resolved ones are fine-tuned on
    lr: float | None = Field(None, gt=0)  # SFT learning rate; defaults to optimizer.lr


class RLSection(Section):
    """DAPO RL: synchronous (max_staleness 0, the paper's) or with bounded staleness."""

    iterations: int = Field(10, gt=0)  # RL iterations (each: sample, grade, train)
    problems_per_iteration: int = Field(300, gt=0)  # tasks sampled per iteration
    group_size: int = Field(10, ge=2)  # episodes per task per iteration (a group; advantages within it)
    # trajectories per optimizer step (an iteration takes several)
    trajectories_per_step: int = Field(128, gt=0)
    eps_low: float = Field(0.2, ge=0, lt=1)  # DAPO's lower clip range of the importance ratio
    eps_high: float = Field(0.28, ge=0)  # DAPO's upper clip range (clip-higher)
    # episodes of this many turns or more get the paper's length penalty
    turn_penalty_threshold: int = Field(10, gt=0)
    # DAPO dynamic sampling: draw new groups for those whose rewards are all equal
    resample_to_fill: bool = False
    # with resample_to_fill: at most this many extra rounds per iteration
    max_resample_rounds: int = Field(0, ge=0)
    # Orbax checkpoint every N iterations (and after the last); written in the background
    checkpoint_every: int = Field(1, gt=0)
    # solved_fraction: RL stage 2's filter by the tasks' solve rates (history_from)
    task_filter: Literal["none", "solved_fraction"] = "none"
    drop_solved_fraction: float | str = (
        "2/3"  # exact: "2/3" or a number (nearest fraction, denominator <= 100)
    )
    drop_never_solved: bool = True  # solved_fraction filter: also drop tasks never solved
    history_from: str | None = None  # run dir whose success history feeds the task filter
    # drop tasks whose stored test strength (the fraction of wrong fixes derived from gold that their
    # tests reject; `jaxswe tasks filter --min-strength`) is below this; None: no strength filter
    min_strength: float | None = Field(None, ge=0, le=1)
    # token-level truncated importance sampling (rollout vs trainer); None: on when max_staleness > 0
    tis_correction: bool | None = None
    tis_cap: float = Field(2.0, gt=0)  # truncated importance sampling: the ratio's cap
    # off-policy masking (losses.off_policy_weights): drop a trajectory whose sequence ("sequence")
    # or geometric-mean ("geometric") trainer/rollout ratio is outside [1/threshold, threshold]
    sequence_mask: Literal["none", "sequence", "geometric"] = "none"
    mask_threshold: float = Field(2.0, gt=1)  # sequence_mask: the ratio bound
    # async RL (jaxswe.rl.pump): groups are sampled up to this many policy versions ahead of the
    # trainer; 0 = the paper's synchronous loop
    max_staleness: int = Field(0, ge=0)
    # k > 0: how a token more than max_staleness versions old trains (jaxswe.rl.groups.trains)
    stale_tokens: Literal["drop", "trajectory", "keep"] = "drop"
    entropy_coef: float = Field(0.0, ge=0)  # entropy bonus on trained tokens; not in DAPO, 0 = off
    # the loss of every token of negative advantage is scaled by this (1: the paper's DAPO; 0: failures
    # push nothing down); this and the next three keys: docs/guide.md, "RL's negative side"
    negative_weight: float = Field(1.0, ge=0)
    # a token of negative advantage whose probability under the current policy is below this gets no
    # gradient (no push-down on what the policy has all but given up); 0: off, the paper's DAPO
    negative_prob_floor: float = Field(0.0, ge=0, lt=1)
    # group advantages (r - mean) / (std + eps), the paper's; false: r - mean (Dr. GRPO: no std division)
    advantage_std: bool = True
    # format-error turns (kept in context) out of the loss, as RFT masks them: "never" (the paper's
    # RL trains them with the episode's advantage), "positive" (out where the advantage is > 0: a
    # success does not reinforce them, a failure still pushes them down), "always"
    mask_format_errors: Literal["never", "positive", "always"] = "never"
    # linear lr warm-up over the RL stage's first optimizer steps (AdamW starts fresh at RL);
    # None: optimizer.warmup_steps (the paper gives RL none)
    warmup_steps: int | None = Field(None, ge=0)
    # one warning per stage when an iteration takes more optimizer steps (the paper reports 2 to 8;
    # more steps per iteration train further off the sampling policy); None: no check
    max_optimizer_steps: int | None = Field(8, gt=0)
    # sampling-bias alarm (jaxswe.rollout.bias): fires when trained tokens are this many nats/token
    # less surprising than the trainer's entropy, at this z; stops the run unless bias_alarm_stop false
    bias_alarm_nats: float = Field(0.01, ge=0)
    # sampling-bias alarm: the z-score it fires at (see bias_alarm_nats)
    bias_alarm_z: float = Field(4.0, gt=0)
    bias_alarm_stop: bool = True
    # stop the stage with one error naming the last cause after this many iterations in a row in which
    # more than half the episodes failed on infrastructure (sandbox, grading, server: such episodes
    # are neither scored nor trained, so the stage would go on learning from almost nothing);
    # --resume continues once it is fixed; None: never stop
    infra_stop_iterations: int | None = Field(3, gt=0)
    seq_len: int = Field(65536, gt=0)  # packed row length of the RL train step (tokens)
    rows_per_step: int | None = Field(None, gt=0)  # fixed [rows, seq_len] per optimizer step (one compile)
    # without rows_per_step: rows padded up the ladder of this ratio (jaxswe.packing.bucket_rows)
    row_bucket_ratio: float = Field(ROW_BUCKET_RATIO, ge=1)

    @property
    def tis_on(self) -> bool:
        """Whether the loss applies truncated importance sampling: `tis_correction`, else k > 0
        (over 12 toy seeds it took k = 1 from 1.29x to 1.05x k = 0's samples, docs/performance.md)."""
        return self.max_staleness > 0 if self.tis_correction is None else self.tis_correction

    @model_validator(mode="after")
    def _fraction_in_range(self) -> RLSection:
        try:
            value = Fraction(str(self.drop_solved_fraction))
        except (ValueError, ZeroDivisionError):
            raise ValueError(
                f"drop_solved_fraction {self.drop_solved_fraction!r} is not a fraction"
            ) from None
        if not 0 < value <= 1:
            raise ValueError(f"drop_solved_fraction must be in (0, 1], got {self.drop_solved_fraction}")
        return self


class LoggingSection(Section):
    """Where metrics rows go besides metrics.jsonl (jaxswe.run.loggers)."""

    # metric sinks besides metrics.jsonl
    backends: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=lambda: ["tensorboard"])
    project: str = "jaxswe"  # the W&B project / MLflow experiment


class EvalSection(Section):
    """Pass@1 over k samples and Pass@k."""

    samples_per_task: int = Field(1, gt=0)  # episodes per task (pass@1 is their mean)
    # the k of each pass@k reported (each <= samples_per_task)
    pass_at_k: list[int] = Field(default_factory=lambda: [1])
    temperature: float = Field(1.0, ge=0)  # sampling temperature of eval episodes
    after_stage: bool = False  # also evaluate each training stage's final weights (its pass_at_1)
    max_tasks: int | None = Field(None, gt=0)  # first N eval tasks only
    # held-out check: instance ids of env.eval_tasks that no stage trains on (never in task_subset);
    # with after_stage, each training stage is also evaluated on them (heldout_eval.json) and the
    # pipeline's summary.json compares the stages there too (paired_heldout)
    heldout: list[str] = Field(default_factory=list)
    heldout_samples: int | None = Field(None, gt=0)  # episodes per held-out task; default samples_per_task
    # `jaxswe eval` with no weights (no --init-from, init_from, trained stage in --run-dir or
    # model.path) evaluates a random init of model.preset only when true; refused otherwise
    allow_random_init: bool = False


class RunConfig(Section):
    """A whole runnable setup."""

    name: str = "run"  # the run's name (banners, metrics, W&B run name)
    # what `jaxswe pipeline` runs, in order
    stages: list[Literal["warmstart", "rft", "rl", "eval"]] = Field(default_factory=lambda: ["eval"])
    init_from: str | None = None  # checkpoint or run dir the first stage starts from
    # a training stage that trains nothing (RL: no optimizer step, every group's rewards equal; RFT:
    # no resolved sample to fine-tune on) ends with an error (exit 2) unless this is true
    allow_untrained_stage: bool = False
    task_subset: list[str] | None = None  # only these instance ids of env.tasks / env.eval_tasks
    seed: int = 0  # seeds every stage's sampling, task and data order, and the toy tasks
    model: ModelSection = Field(default_factory=ModelSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    mesh: MeshSection = Field(default_factory=MeshSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    env: EnvSection = Field(default_factory=EnvSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    sft: SFTSection = Field(default_factory=SFTSection)
    warmstart: WarmStartSection = Field(default_factory=WarmStartSection)
    rft: RFTSection = Field(default_factory=RFTSection)
    rl: RLSection = Field(default_factory=RLSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected section.key=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text}: empty key")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b.c=value` override set."""
    data = copy.deepcopy(data)
    for text in overrides:
        path, value = _parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {text}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the config accepts beside `loc[-1]` (empty where `loc` is not inside a section)."""
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _error_source(loc: tuple[str, ...], where: str, overrides: list[str]) -> str:
    """`--set K=V` when the last override touching `loc` caused the error, else the file."""
    for text in reversed(overrides):
        parts = tuple(text.split("=", 1)[0].split("."))
        if parts[: len(loc)] == loc or loc[: len(parts)] == parts:
            return f"--set {text}"
    return where


def _first_error(where: str, err: ValidationError, overrides: list[str]) -> ConfigError:
    e = err.errors()[0]
    loc = tuple(str(p) for p in e["loc"])
    key = ".".join(loc) or "(top level)"
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        close = difflib.get_close_matches(loc[-1], _known_keys(loc), n=1)
        msg = "unknown key" + (f" (did you mean {'.'.join((*loc[:-1], close[0]))}?)" if close else "")
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return ConfigError(f"{_error_source(loc, where, overrides) if loc else where}: {key}: {msg}{more}")


def config_from_dict(
    data: dict[str, Any], *, where: str = "config", overrides: list[str] | None = None
) -> RunConfig:
    """Validate a plain dict as a RunConfig; errors name `where` (or the override applied) and the key."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise _first_error(where, err, overrides or []) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config, apply overrides, validate. Raises ConfigError with one line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{line} invalid YAML") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    data = apply_overrides(data, overrides or [])
    return config_from_dict(data, where=str(path), overrides=overrides)


def dump_config(config: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (what a run actually used)."""
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
