"""`python -m corecpu.install`: kept at this name because scripts, launch.sh and cluster manifests call it.

The code lives in corecpu/launching/install.py.
"""

from corecpu.launching.install import main

if __name__ == "__main__":
    raise SystemExit(main())
