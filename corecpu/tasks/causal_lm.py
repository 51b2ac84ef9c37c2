"""Causal language-model fine-tuning (SFT): full, or LoRA through peft.

What varies here from the other tasks: data as the ecosystem writes it (plain text, prompt/completion
rows, chat conversations rendered by the tokenizer's own template), the loss on completion tokens only
by default, examples packed into --max-seq-len rows that never attend across documents, a loss averaged
over every label token of the global step (not over micro-batches: see `loss_items`), and an evaluation
of held-out loss, perplexity and greedy completions scored by exact match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from torch.utils.data import DataLoader

from corecpu import notices
from corecpu.compute.wrappers import unwrap
from corecpu.data.builtin_sft import SFT_NAME, builtin_sft, unigram_baseline
from corecpu.data.causal_records import FORMAT_CHOICES, CausalData, read_causal_data
from corecpu.data.causal_tokens import Tokenized, tokenize_causal
from corecpu.data.packing import CausalFeatures, make_causal_collate
from corecpu.errors import CoreCPUError
from corecpu.reporting.model_card import CAUSAL_CARD, LORA_CARD, write_model_card
from corecpu.tasks.causal_eval import eval_loss, generate_share, write_generations
from corecpu.training.builtin_models import is_builtin_causal
from corecpu.training.causal_model import load_causal_lm
from corecpu.training.label_logits import compute_logits_where_labelled
from corecpu.training.modeling import resolve_model_dir
from corecpu.training.memory_budget import ModelShape, check_fits, estimate, node_budget
from corecpu.training.lora import LoraSettings, add_lora, merged_copy, trainable_summary
from corecpu.training.run import Run
from corecpu.training.run_options import opt
from corecpu.training.train_config import TaskOptions, TrainConfig


BUILTIN_GENERATE = 100  # held-out prompts completed at each evaluation on the built-in set


@dataclass(frozen=True)
class CausalLMOptions(TaskOptions):
    """`cfg.task_options` of --task causal-lm."""

    summary = "causal language-model fine-tuning (SFT), full or LoRA"
    default_data = SFT_NAME
    eval_metrics = ("eval_loss", "eval_perplexity", "eval_exact_match")
    default_max_seq_len = 128
    default_model = "llama-tiny"
    # The built-in job learns in steps, not epochs: small batches of packed rows, more passes (2 ranks on 2 cores:
    # ~1,000 steps in about two minutes; see README).
    default_batch_size = 4
    default_epochs = 8

    data_format: str = opt("auto", "format of --data/--eval-data; auto: from the extension (a directory: datasets)",
                           choices=FORMAT_CHOICES)
    text_column: str = opt("", "column of plain text (loss on every token); default: text", metavar="COL",
                           defines_run=True)
    prompt_column: str = opt("", "column of prompts; default: prompt", metavar="COL", defines_run=True)
    completion_column: str = opt("", "column of completions; default: completion", metavar="COL", defines_run=True)
    messages_column: str = opt("", "column of conversations ([{role, content}, ...], rendered with the tokenizer's "
                               "chat template); default: messages", metavar="COL", defines_run=True)
    completion_only_loss: bool = opt(True, "loss on completion / assistant tokens only (plain text: every token)",
                                     defines_run=True)
    packing: bool = opt(True, "pack several examples into each --max-seq-len row (documents never attend to each "
                        "other); --no-packing: one example per row, padded per batch", defines_run=True)
    lora_r: int = opt(0, "LoRA rank; 0: full fine-tuning", defines_run=True)
    lora_alpha: float = opt(16.0, "LoRA alpha (the adapters' scale is alpha / r)", defines_run=True)
    lora_dropout: float = opt(0.05, "dropout on the LoRA path", defines_run=True)
    lora_target_modules: str = opt("", "comma-separated linear layers to adapt (e.g. q_proj,v_proj); default: every "
                                   "linear layer of the blocks", metavar="LIST", defines_run=True)
    merge_lora: bool = opt(False, "also write final/merged/: the base with the adapters merged in")
    gradient_checkpointing: bool = opt(False, "recompute activations in the backward: less memory, more compute",
                                       defines_run=True)
    eval_generate: int = opt(-1, f"greedy completions of N held-out prompts at each evaluation, to "
                             f"generations.jsonl; -1: {BUILTIN_GENERATE} on the built-in set, else 0")
    max_new_tokens: int = opt(32, "the longest completion --eval-generate writes")

    def lr_for(self, cfg: TrainConfig) -> float:
        if self.lora_r:
            return 2e-4
        return 1e-3 if is_builtin_causal(cfg.model) else 2e-5  # a random built-in model starts from nothing

    def lora(self) -> LoraSettings | None:
        targets = tuple(t.strip() for t in self.lora_target_modules.split(",") if t.strip())
        return LoraSettings(self.lora_r, self.lora_alpha, self.lora_dropout, targets) if self.lora_r else None

    def validate(self, cfg: TrainConfig) -> None:
        if self.lora_r < 0:
            raise CoreCPUError(f"--lora-r must be a positive rank (e.g. 8), or 0 for full fine-tuning; got {self.lora_r}")
        if self.lora_r and self.lora_alpha <= 0:
            raise CoreCPUError(f"--lora-alpha must be positive, got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            raise CoreCPUError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if not self.lora_r and (self.merge_lora or self.lora_target_modules):
            flag = "--merge-lora" if self.merge_lora else "--lora-target-modules"
            raise CoreCPUError(f"{flag} needs LoRA; pass --lora-r (e.g. 8)")
        if self.eval_generate < -1 or self.max_new_tokens < 1:
            raise CoreCPUError("--eval-generate must be -1, 0 or a count, and --max-new-tokens at least 1")
        if cfg.max_seq_len < 8:
            raise CoreCPUError(f"--max-seq-len {cfg.max_seq_len} is too short for a language model; pass 128 or more")


@dataclass
class TaskData:
    train: CausalData
    eval: CausalData | None
    baseline: float | None = None  # the unigram guess's exact match on the built-in set's held-out split
    tokenized_notes: list[str] = field(default_factory=list)  # features() adds them (truncation), before they print
    memory: str = ""  # features() sets it: the memory estimate, for describe()

    @property
    def notes(self) -> list[str]:
        return list(self.train.notes) + (list(self.eval.notes) if self.eval else []) + self.tokenized_notes


@dataclass
class _Held:
    """What features() learns that evaluate() and the model card read back (this rank's own)."""

    tokenizer: Any = None
    eval_tokens: Tokenized | None = None


class CausalLM:
    """--task causal-lm; the contract it keeps is corecpu.tasks.contract.Task."""

    name = "causal-lm"
    Options = CausalLMOptions

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.options: CausalLMOptions = cfg.task_options  # type: ignore[assignment]  (make_task checks it)
        self._held = _Held()
        self._model: Any = None  # the model built here (PeftModel with LoRA): --merge-lora merges it at the end

    @staticmethod
    def loss_items(batch: Mapping[str, Any]) -> float:
        """The model's loss is a mean over label tokens: the step weighs each micro-batch by them."""
        return float(batch["num_label_tokens"])

    def load(self) -> TaskData:
        cfg, opts = self.cfg, self.options
        columns = dict(fmt=opts.data_format, text_column=opts.text_column, prompt_column=opts.prompt_column,
                       completion_column=opts.completion_column, messages_column=opts.messages_column)
        train = self._read(cfg.data, "train", columns)
        spec = cfg.eval_data
        if spec == "auto":
            spec = cfg.data if cfg.data == SFT_NAME else "none"
        held = None if spec == "none" else self._read(spec, "eval", columns)
        baseline = None
        if cfg.data == SFT_NAME and held is not None and spec == SFT_NAME:
            baseline = unigram_baseline(list(train.rows), list(held.rows))
        return TaskData(train, held, baseline)

    def _read(self, spec: str, split: str, columns: dict[str, str]) -> CausalData:
        if spec == SFT_NAME:
            used = [k for k, v in columns.items() if v not in ("", "auto")]
            if used:
                raise CoreCPUError(f"--{used[0].replace('_', '-')} does not apply to the built-in set --data "
                                   f"{SFT_NAME}; drop it or pass --data PATH")
            return CausalData("prompt_completion", tuple(builtin_sft(split, seed=0)), f"built-in {SFT_NAME} ({split})")
        if spec in ("builtin", "paraphrase", "qa"):
            raise CoreCPUError(f"'{spec}' is a built-in set of another task; --task causal-lm trains on "
                               f"--data {SFT_NAME} or a file")
        return read_causal_data(spec, split=split, **columns)

    def model(self, data: TaskData) -> tuple[torch.nn.Module, str]:
        model, desc = load_causal_lm(self.cfg.model, self.cfg.seed)
        compute_logits_where_labelled(model)  # the head and loss at label tokens only: same loss, less work
        if self.options.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False  # training: no key/value cache to keep
        lora = self.options.lora()
        if lora:
            model = add_lora(model, lora, self.cfg.seed)
            desc += f"; {lora.describe()}; {trainable_summary(model)}"
        self._model = model
        return model, desc

    def features(self, data: TaskData, tokenizer: Any, run: Run) -> tuple[CausalFeatures, CausalFeatures | None]:
        """Tokenized on every rank (a fast tokenizer does the built-in set in well under a second)."""
        cfg, opts = self.cfg, self.options
        with notices.phase(f"tokenizing {len(data.train):,} training and {len(data.eval) if data.eval else 0:,} eval "
                           "records"):
            train = tokenize_causal(data.train, tokenizer, cfg.max_seq_len,
                                    completion_only_loss=opts.completion_only_loss)
            held = (tokenize_causal(data.eval, tokenizer, cfg.max_seq_len, completion_only_loss=opts.completion_only_loss)
                    if data.eval else None)
        self._held = _Held(tokenizer, held)
        data.tokenized_notes[:] = [n for n in (_cut(train, "training"), _cut(held, "eval")) if n]
        data.memory = self._check_memory(run.launch.local_world_size)
        return (CausalFeatures(train, cfg.max_seq_len, opts.packing),
                CausalFeatures(held, cfg.max_seq_len, opts.packing) if held else None)

    def _check_memory(self, local_ranks: int) -> str:
        """Refuse in one line a run the node cannot hold (corecpu.training.memory_budget); else say what it takes."""
        opts = self.options
        est = estimate(ModelShape.of(self._model), batch=self.cfg.batch_size, seq=self.cfg.max_seq_len,
                       lora=bool(opts.lora_r), checkpointing=opts.gradient_checkpointing)
        limit, available = node_budget(local_ranks)
        check_fits(est, local_ranks, limit=limit, available=available, lora=bool(opts.lora_r),
                   checkpointing=opts.gradient_checkpointing)
        return f"memory {est.describe(local_ranks)}, estimated (summary.json: each rank's peak)"

    def collate(self, tokenizer: Any):  # noqa: ANN201 - a collate function
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return make_causal_collate(pad, self.cfg.pad_to_multiple_of, self.cfg.max_seq_len)

    def checkpoint_config(self, data: TaskData) -> dict[str, Any]:
        return {"data_kind": data.train.kind}

    def describe(self, data: TaskData) -> str:
        held = f"{len(data.eval)} eval" if data.eval else "no eval"
        base = f"; unigram baseline exact match {data.baseline:.3f}" if data.baseline is not None else ""
        how = "packed" if self.options.packing else "one per row"
        return (f"{len(data.train)} train / {held} examples ({data.train.kind.replace('_', '/')}, {how}, "
                f"loss on {'completions' if self.options.completion_only_loss else 'every token'}){base}"
                + (f"; {data.memory}" if data.memory else ""))

    def evaluate(self, run: Run, model: torch.nn.Module, loader: DataLoader) -> dict[str, float]:
        with run.evaluating(model):
            scores: dict[str, float] = eval_loss(run, model, loader)
            prompts = _prompts(self._held.eval_tokens, self._generate_count())
            if prompts:
                tok = self._held.tokenizer
                rows = generate_share(run, unwrap(model), tok, prompts, self.options.max_new_tokens)
                scores["eval_exact_match"] = sum(r["exact_match"] for r in rows) / len(rows)
                scores["eval_generated"] = len(rows)
                if run.is_main:
                    write_generations(Path(self.cfg.output_dir), run.step, rows)
        return scores

    def _generate_count(self) -> int:
        n = self.options.eval_generate
        return (BUILTIN_GENERATE if self.cfg.data == SFT_NAME else 0) if n < 0 else n

    @staticmethod
    def eval_line(step: int, scores: Mapping[str, float]) -> str:
        em = f" | exact match {scores['eval_exact_match']:.3f}" if "eval_exact_match" in scores else ""
        return (f"eval  step {step} | loss {scores['eval_loss']:.4f} | perplexity {scores['eval_perplexity']:.2f}"
                f"{em} | {scores['eval_tokens']} tokens")

    def model_card(self, final: Path, config: Mapping[str, Any], summary: Mapping[str, Any],
                   data: TaskData) -> None:
        lora = self.options.lora()
        if lora and self.options.merge_lora:
            merged = merged_copy(self._model)  # in place: the training is over, the adapter already saved
            merged.save_pretrained(final / "merged", safe_serialization=True)
            self._held.tokenizer.save_pretrained(final / "merged")
        desc = data.train.source + (f"; the unigram guess scores exact match {data.baseline:.3f} on its held-out "
                                     "split" if data.baseline is not None else "")
        write_model_card(final, {**config, "base_model_path": str(resolve_model_dir(self.cfg.model))}, summary, None,
                         desc, kind=LORA_CARD if lora else CAUSAL_CARD)


def _cut(tok: Tokenized | None, what: str) -> str | None:
    if tok is None or not tok.truncated:
        return None
    return (f"{tok.truncated} {what} example(s) longer than --max-seq-len were truncated; pass a larger "
            "--max-seq-len to keep them whole")


def _prompts(tok: Tokenized | None, n: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reference ids) of the first `n` held-out examples that have a prompt: the tokens before the
    first loss token, and that first run of loss tokens (the completion, or the first assistant turn)."""
    if tok is None or n <= 0:
        return []
    out = []
    for ids, mask in zip(tok.input_ids, tok.loss_mask):
        first = next((i for i, m in enumerate(mask) if m), None)
        if not first:  # plain text (loss from the first token) has no prompt to complete
            continue
        end = next((i for i in range(first, len(mask)) if not mask[i]), len(mask))
        out.append((ids[:first], ids[first:end]))
        if len(out) == n:
            break
    return out
