"""What varies between jobs train.py runs: how data becomes features, which model class, what one
evaluation computes. One module per task (classification); extractive QA's building blocks are
qa_features (run_qa.py-style windows), qa_postprocess (n-best spans) and qa_metrics (SQuAD EM/F1).

May import: reporting, training and everything below them.
"""
