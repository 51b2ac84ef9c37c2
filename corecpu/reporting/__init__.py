"""What a run tells people and tools: start-up lines, progress, metrics.jsonl, summary.json and
final/ (reporter), experiment trackers, `corecpu report` (run_report) and the model card.

May import: training and everything below it.
"""
