"""What varies between jobs train.py runs: how data becomes features, which model class, what one
evaluation computes. One module per task; train.py picks one by --task.

May import: reporting, training and everything below them.
"""
