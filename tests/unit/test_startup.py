"""train.py imports torch and transformers without the collector walking them (three full collections cost a
2-rank start-up 0.6 s), then freezes what they built and turns collection back on."""

import subprocess
import sys

from helpers.common import ROOT

PROBE = """
import gc
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "start" and info["generation"] == 2 else None)
import train
print(len(full), gc.isenabled(), gc.get_freeze_count())
"""


def test_importing_train_runs_no_full_collection_and_freezes_what_it_built():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    full, enabled, frozen = proc.stdout.split()
    assert full == "0"
    assert enabled == "True"
    assert int(frozen) > 100_000  # torch's and transformers' objects, out of every later collection
