"""`python -m corecpu.launch`: kept at this name because scripts, launch.sh and cluster manifests call it.

The code lives in corecpu/launching/launch.py.
"""

from corecpu.launching.launch import main

if __name__ == "__main__":
    main()
