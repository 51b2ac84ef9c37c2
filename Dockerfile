# syntax=docker/dockerfile:1
# corecpu in one image: Python slim, the CPU build of torch (pinned by constraints.txt), corecpu
# with Intel MPI's mpirun (impi-rt), numactl, and the ssh that mpi-operator's MPIJob needs.
#
#   docker build -t corecpu .
#   docker run --rm --shm-size=2g corecpu ./launch.sh 2 --model tiny --max-steps 20
#   docker run --rm --shm-size=2g -v "$PWD/data:/data" corecpu ./launch.sh 2 --data /data/train.tsv
#
# The image is the environment ./launch.sh makes on a fresh machine: launch.sh itself installs
# it, so its set-up finds it complete at run time and installs nothing.
FROM python:3.12-slim-bookworm

# PyTorch's CPU wheel index: PyPI's torch for Linux is the CUDA build (GBs of nvidia libraries).
ARG CORECPU_TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV CORECPU_TORCH_INDEX=${CORECPU_TORCH_INDEX} \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# numactl: memory binding per rank; openssh: mpirun reaches MPIJob workers over ssh; tcmalloc: the ranks preload it
# (MiniLM trained 0.99-1.16x as fast as on glibc's malloc: corecpu/cpu/allocator.py).
RUN apt-get update \
 && apt-get install -y --no-install-recommends numactl openssh-client openssh-server libtcmalloc-minimal4 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 corecpu \
 && python -m venv "$VIRTUAL_ENV"

WORKDIR /opt/corecpu

# torch first, in its own layer: it is most of the image and changes least.
COPY constraints.txt ./
RUN pip install -c constraints.txt --extra-index-url "$CORECPU_TORCH_INDEX" torch \
 && python -c "import torch; assert torch.version.cuda is None, torch.__version__"

COPY pyproject.toml README.md launch.sh image-constraints.txt ./
COPY corecpu/ corecpu/
# Every dependency at the version image-constraints.txt names (torch stays as installed above).
RUN PIP_CONSTRAINT=image-constraints.txt ./launch.sh --setup-only

COPY --chown=corecpu train.py test.sh ./
COPY --chown=corecpu tests/ tests/
COPY --chown=corecpu examples/ examples/
COPY --chown=corecpu benchmarks/ benchmarks/

# MPIJob workers run sshd as the non-root user on 2222 with the key mpi-operator mounts at
# sshAuthMountPath (/home/corecpu/.ssh); the launcher's ssh uses the same port.
RUN printf 'Port 2222\nPidFile /home/corecpu/sshd.pid\nHostKey /home/corecpu/.ssh/id_rsa\nStrictModes no\n' \
      > /home/corecpu/.sshd_config \
 && printf 'Host *\n  Port 2222\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n' >> /etc/ssh/ssh_config \
 && chown -R corecpu /home/corecpu /opt/corecpu

# Numeric, so that Kubernetes' runAsNonRoot can check it (the manifests set runAsUser: 1000).
USER 1000:1000
CMD ["./launch.sh", "2", "--model", "tiny", "--max-steps", "20"]
