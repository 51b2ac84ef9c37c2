"""What varies between jobs train.py runs: how data becomes features, which model class, what one
evaluation computes. `contract.Task` writes down what a task provides; `registry` lists the tasks
(the --task choices) and builds the command line with each task's own options section. One module
per task (classification, qa); extractive QA's building blocks are qa_features (run_qa.py-style
windows), qa_postprocess (n-best spans) and qa_metrics (SQuAD EM/F1).

May import: reporting, training and everything below them.
"""
