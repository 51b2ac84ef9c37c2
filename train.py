"""Fine-tune a Hugging Face model with DistributedDataParallel on CPUs.

    ./launch.sh 2                                   # 2 ranks through mpirun, the built-in job
    ./launch.sh 4 --data train.tsv --eval-data dev.tsv --model PATH
    ./launch.sh 2 --task qa --data train-v1.1.json --eval-data dev-v1.1.json   # extractive QA (SQuAD)
    ./launch.sh 2 --task causal-lm --model PATH --data chat.jsonl --lora-r 8   # LM fine-tuning (SFT), LoRA
    torchrun --nproc-per-node 2 train.py --model tiny
    python train.py --config run.yaml --lr 5e-5      # a config file's keys are the flags; flags override it
    python train.py --help
    corecpu train ...  /  corecpu launch -n 2 train ...   # pip-installed: corecpu/train.py is this file

The whole loop is in this file, top to bottom. It uses corecpu through the same front
door as any research script (`corecpu.setup()`, `run.wrap()`, `run.steps()`); what varies
between jobs (features, model class, evaluation) is the task object, corecpu/tasks/.
"""

from __future__ import annotations

import gc

# Importing torch and transformers builds millions of long-lived objects, and the collector kept walking them
# (three full collections, about 0.6 s of a 2-rank start-up, measured). Nothing imported is garbage: collect none
# of it now, and none of it later (freeze).
gc.disable()
import torch

import corecpu
from corecpu.data.tokenized import pop_meta
from corecpu.reporting.reporter import Reporter
from corecpu.reporting.trackers import parse_report_to
from corecpu.tasks.registry import make_task, parse_config
from corecpu.training import outputs
from corecpu.training.lr_schedule import linear_warmup_decay
from corecpu.training.train_config import TrainConfig
from corecpu.training.output_lock import OutputLock
from corecpu.training.modeling import check_inputs, load_tokenizer, optimizer_groups, weights_bytes

gc.freeze()
gc.enable()


def main() -> None:
    cfg = parse_config(description=__doc__.split("\n")[0])
    with corecpu.setup(cfg.run, graceful_stop=True) as run:
        train(cfg, run)


def train(cfg: TrainConfig, run: corecpu.Run) -> None:
    task = make_task(cfg)  # the --task (tasks/registry.py): how data becomes features, the model class, what eval computes
    # -------------------------------------------------------------- data and model
    # Every rank validates its inputs; a bad file on one host stops every rank with its message.
    with run.agreeing():
        trackers = parse_report_to(cfg.report_to)
        kept = cfg.keep_checkpoints + bool(cfg.keep_best)  # --keep-best may keep one more
        outputs.check(cfg.output_dir, need_bytes=outputs.estimate_run_bytes(weights_bytes(cfg.model), kept))
        tokenizer = load_tokenizer(cfg.model)
        check_inputs(cfg.model, tokenizer, cfg.max_seq_len)
        data = task.load()
        model, model_desc = task.model(data)
        lock = OutputLock.acquire(cfg.output_dir) if run.is_main else None  # one run per output directory
        if lock:
            run.on_close(lock.release)

    torch.manual_seed(cfg.seed + run.rank)  # dropout differs per rank; the data order does not (sampler seed)
    train_set, eval_set = task.features(data, tokenizer, run)
    collate = task.collate(tokenizer)
    loader = run.loader(train_set, cfg.batch_size, seed=cfg.seed, collate_fn=collate,
                        lengths=train_set.lengths if cfg.group_by_length else None)
    eval_loader = (run.eval_loader(eval_set, cfg.batch_size, collate_fn=collate, lengths=eval_set.lengths)
                   if eval_set else None)  # longest first: evaluation's padding is pure waste
    steps = run.steps(loader, epochs=cfg.epochs, max_steps=cfg.max_steps, grad_accum=cfg.grad_accum)

    # The fused CPU kernel updates all parameters in one pass: 16 ms instead of 125 ms per step for
    # MiniLM (measured). IPEX, when used, brings its own step and expects the plain optimizer.
    optimizer = torch.optim.AdamW(optimizer_groups(model, cfg.weight_decay), lr=cfg.lr, fused=not run.uses_ipex)
    scheduler = linear_warmup_decay(optimizer, int(cfg.warmup_ratio * steps.total), steps.total)
    if cfg.keep_best and eval_loader is None:  # --eval-data auto of a file is none: known only now
        raise corecpu.CoreCPUError(f"--keep-best {cfg.keep_best} needs evaluation data; pass --eval-data FILE")
    ckpt = corecpu.Checkpoints(cfg.output_dir, every=cfg.save_every, keep=cfg.keep_checkpoints, resume=cfg.resume,
                               config={**cfg.to_dict(), **task.checkpoint_config(data)}, compare=cfg.run_defining(),
                               best=cfg.keep_best)
    # Precision on the loader's shapes, resume, IPEX, compile, DDP: wrap() owns that order.
    model, optimizer = run.wrap(model, optimizer, scheduler, loader=loader, checkpoint=ckpt)

    start = run.resumed.step if run.resumed else 0
    report = Reporter(run, cfg.output_dir, cfg.to_dict(), steps.total, cfg.progress, log_every=cfg.log_every,
                      resume_step=start if run.resumed else None, trackers=trackers)
    run.on_close(report.close)
    for line in run.banner() + [f"model {model_desc}"]:
        report.say(line)
    report.say(f"data {task.describe(data)}; global batch {cfg.batch_size * run.world_size * cfg.grad_accum}; "
               f"{steps.total} steps" + (f"; resuming from {run.resumed.path} (step {run.resumed.step})"
                                         if run.resumed else ""))
    for note in data.notes + ckpt.notes + [n for n in (lock and lock.note, run.precision.warning) if n]:
        report.say(f"[yellow]warning:[/] {note}")

    # -------------------------------------------------------------- training
    # run.steps() owns epochs, the resume position, the watchdog and stop signals (save, exit 75).
    report.start(start)
    model.train()
    for step in steps:
        # Gradients are all-reduced only in the last micro-batch's backward. A task whose loss is a mean over
        # tokens has the step weigh each micro-batch by them (task.loss_items; None: all micro-batches alike).
        for batch in step.micro_batches(count=task.loss_items):
            meta = pop_meta(batch)  # num_tokens, num_padded, num_attended, valid (num_label_tokens): not inputs
            loss = model(**batch).loss  # the wrapped forward autocasts where bf16 was chosen
            step.backward(loss)
            report.add(loss, len(batch["input_ids"]), meta, weight=step.weight)
        # The norm before clipping; with the fused AdamW the scale is applied inside optimizer.step(), in its one pass.
        grad_norm = run.clip_grad_norm_(cfg.max_grad_norm) if cfg.max_grad_norm > 0 else None
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        report.step_done(step, lr, grad_norm)  # a line and a metrics.jsonl record every --log-every steps
        # Every --eval-steps steps (0: at each epoch's end), and at the last step.
        if eval_loader is not None and step.ends_interval(cfg.eval_steps):
            report.evaluating(step.number, len(eval_loader))
            scores = task.evaluate(run, model, eval_loader)
            report.log_eval(step.number, step.epochs_done, scores, task.eval_line(step.number, scores))
            ckpt.note_eval(step, scores)  # with --keep-best: a new best is saved now and kept
        ckpt.save(step)  # every --save-every steps, and the last one: after the evaluation, so a resume skips it

    # -------------------------------------------------------------- finish
    report.finish(model, tokenizer, steps.completed,
                  card=lambda final, summary: task.model_card(final, cfg.to_dict(), summary, data))


if __name__ == "__main__":
    corecpu.run_cli(main, fast_exit=True)  # the interpreter's teardown of torch and transformers is 0.2 s per rank
