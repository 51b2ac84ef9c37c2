"""What a run tells people and tools: start-up lines, progress, metrics.jsonl, summary.json and
final/ (reporter), experiment trackers, `corecpu report` (run_report), the model card, and what a run
learns about its machine (rank_history, rank_wait, cpu_taken).

May import: training and everything below it.
"""
