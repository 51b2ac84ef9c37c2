"""`python -m corecpu.bind`: kept at this name because scripts, launch.sh and cluster manifests call it.

The code lives in corecpu/launching/bind.py.
"""

from corecpu.launching.bind import main

if __name__ == "__main__":
    main()
