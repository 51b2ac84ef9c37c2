"""`corecpu report`: a synthetic run directory rendered to PNG and summarized; missing files."""

from __future__ import annotations

import json

import pytest

from corecpu.cli import main
from corecpu.errors import CoreCPUError
from corecpu.reporting.run_report import load_run, render, summarize

pytest.importorskip("matplotlib")


def make_run(path, ranks=2, epochs=2, steps_per_epoch=6, topology=True, summary=True, scale=1.0):
    path.mkdir(parents=True)
    lines = []
    for step in range(1, epochs * steps_per_epoch + 1):
        epoch = (step - 1) // steps_per_epoch
        lines.append({"step": step, "epoch": epoch, "loss": scale * 0.7 / step, "lr": 1e-4 * (1 - step / 20),
                      "samples_per_s": 50.0 + step, "tokens_per_s": 900.0, "elapsed_s": step * 0.5})
        if step % steps_per_epoch == 0:
            lines.append({"step": step, "epoch": epoch, "eval_loss": 0.5 / (epoch + 1), "eval_accuracy": 0.8 + 0.1 * epoch,
                          "eval_f1": 0.75 + 0.1 * epoch, "eval_examples": 40})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (path / "config.json").write_text(json.dumps({"model": "tiny", "data": "builtin", "batch_size": 4,
                                                  "grad_accum": 1, "lr": 1e-4, "precision": "fp32"}))
    if topology:
        (path / "topology.json").write_text(json.dumps({"ranks": [
            {"host": "node1", "cpus": [2 * r, 2 * r + 1], "torch_threads": 2, "binding": "planned"}
            for r in range(ranks)]}))
    if summary:
        (path / "summary.json").write_text(json.dumps({"steps": epochs * steps_per_epoch, "seconds": 12.5,
                                                       "final_loss": lines[-2]["loss"], "samples_per_s_after_warmup": 61.5,
                                                       "last_eval": lines[-1], "ranks": [{}] * ranks}))
    return path


def test_summary_text(tmp_path):
    run = load_run(make_run(tmp_path / "a"))
    text = summarize(run)
    assert "12 steps on 2 rank(s); model tiny" in text
    assert f"final train loss {0.7 / 12:.4f}" in text
    assert "best eval accuracy 0.9000 at step 12 (epoch 2)" in text
    assert "throughput 61.5 samples/s after warm-up" in text
    assert "rank 1 on node1: CPUs 2-3, 2 thread(s) (planned)" in text
    assert "note:" not in text


def test_png_single_and_compare(tmp_path):
    import matplotlib.image as mpimg

    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", ranks=4, epochs=3, scale=1.5)
    one = render([load_run(a)], tmp_path / "one.png")
    two = render([load_run(a), load_run(b)], tmp_path / "two.png")
    img1, img2 = mpimg.imread(one), mpimg.imread(two)
    assert img1.shape == img2.shape and img1.shape[1] > 1000
    assert img1.std() > 0.05 and abs(img1 - img2).mean() > 0.001  # drawn, and the second run changes it


def test_missing_and_partial_files(tmp_path):
    with pytest.raises(CoreCPUError, match="run directory .* not found"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CoreCPUError, match="has no metrics.jsonl"):
        load_run(tmp_path / "empty")
    partial = make_run(tmp_path / "partial", topology=False, summary=False)
    with (partial / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 13, "lo')  # a line torn by a crash
    (partial / "config.json").write_text("{not json")
    run = load_run(partial)
    text = summarize(run)
    assert "no summary.json (the run has not finished)" in text and "binding: no topology.json" in text
    assert "skipped 1 unreadable line" in text and "config.json is not valid JSON" in text
    assert f"final train loss {0.7 / 12:.4f}" in text  # from metrics.jsonl when the summary is missing
    assert render([run], tmp_path / "p.png").stat().st_size > 0


def test_cli_report(tmp_path, capsys):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    with pytest.raises(SystemExit) as done:
        main(["report", str(a), "--compare", str(b), "--out", str(tmp_path / "r.png")])
    assert done.value.code == 0 and (tmp_path / "r.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert out.count("12 steps on 2 rank(s)") == 2 and f"wrote {tmp_path / 'r.png'}" in out
    with pytest.raises(SystemExit) as done:
        main(["report", str(a)])
    assert done.value.code == 0 and (a / "report.png").is_file()
    with pytest.raises(SystemExit) as failed:
        main(["report", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert failed.value.code == 2 and err.count("\n") == 1 and "not found" in err


def test_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    run = load_run(make_run(tmp_path / "a"))
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(CoreCPUError, match=r"pip install 'corecpu\[report\]'"):
        render([run], tmp_path / "x.png")


def test_qa_runs_report_squad_scores(tmp_path):
    path = make_run(tmp_path / "qa")
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # the same run, scored as a QA run is: exact match and F1 in percent, no eval loss
        if "eval_accuracy" in r:
            for key in ("eval_loss", "eval_accuracy"):
                del r[key]
            r.update(eval_exact_match=60.0 + 10 * r["epoch"], eval_f1=70.5 + 10 * r["epoch"])
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(path)
    assert len(run.evals) == 2
    text = summarize(run)
    assert "best eval F1 80.50 at step 12 (epoch 2); last eval: exact match 70.00, F1 80.50" in text
    assert render([run], tmp_path / "qa.png").stat().st_size > 0


def test_x_axis_samples_and_time_compare_runs_of_other_sizes(tmp_path):
    from corecpu.reporting.run_report import x_values

    path = make_run(tmp_path / "a", epochs=1)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # today's records: fractional epoch, learning_rate, samples per interval; resumed after step 3
        if "loss" in r:
            r.update(samples=8, learning_rate=r["lr"], elapsed_s=(r["step"] - 3 if r["step"] > 3 else r["step"]) * 0.5)
        r["epoch"] = r["step"] / 6
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(path)
    samples, time = x_values(run, "samples"), x_values(run, "time")
    assert [samples(s) for s in (1, 2, 6)] == [8.0, 16.0, 48.0] and samples(2.5) == 20.0
    assert [time(s) for s in (3, 4, 5)] == [1.5, 2.0, 2.5]  # the resumed clock continues, never goes back
    assert "best eval accuracy 0.8000 at step 6 (epoch 1)" in summarize(run)
    with pytest.raises(CoreCPUError, match="x-axis 'epochs' is not one of: steps, samples, time"):
        x_values(run, "epochs")


def test_summary_says_what_ran_and_where_the_time_went(tmp_path):
    path = make_run(tmp_path / "a")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "precision": "auto", "resolved": {"precision": "bf16"}}))
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps({**summary, "peak_rss_mb": 812.4, "phases": {
        "start_up_s": 9.5, "steps_s": 30.25, "eval_s": 4.0, "checkpoint_s": 1.0, "final_save_s": 0.5}}))
    text = summarize(load_run(path))
    assert "precision bf16" in text and "900 tokens/s (median)" in text
    assert "time: start-up 9.5 s, steps 30.2 s, eval 4.0 s, checkpoint 1.0 s, final-save 0.5 s" in text
    assert "peak RSS 812 MB" in text
    assert "lockstep" not in text and "CPU time taken" not in text  # a summary without them (one rank, or older)


def test_summary_says_what_lockstep_cost_and_what_else_took_the_cpus(tmp_path):
    path = make_run(tmp_path / "a")
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps({**summary, "wait_after_warmup": 0.061, "rank_cpu_taken_after_warmup": [
        {"others": 0.012, "steal": 0.004}, {"others": 0.4812, "steal": 0.001}]}))
    text = summarize(load_run(path))
    assert "lockstep: the ranks waited 6.1% of the training time for each other (after warm-up)" in text
    assert ("the ranks' CPU time taken after warm-up: other processes up to 48.1% (rank 1), the hypervisor (steal) "
            "up to 0.4% (rank 0)") in text
    (path / "summary.json").write_text(json.dumps({**summary, "rank_cpu_taken_after_warmup": [None, None]}))
    assert "CPU time taken" not in summarize(load_run(path))


def test_cli_compares_several_runs_on_samples(tmp_path, capsys):
    runs = [make_run(tmp_path / name, ranks=r) for name, r in (("a", 1), ("b", 2), ("c", 4))]
    with pytest.raises(SystemExit) as done:
        main(["report", str(runs[0]), "--compare", str(runs[1]), "--compare", str(runs[2]), "--x", "samples",
              "--out", str(tmp_path / "r.png")])
    assert done.value.code == 0 and (tmp_path / "r.png").stat().st_size > 0
    assert capsys.readouterr().out.count("12 steps on") == 3
