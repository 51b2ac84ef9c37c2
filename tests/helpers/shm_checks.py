"""What every rank of tests/helpers/workers/shm_hook.py must report about the bf16 wire, whatever CPU runs it."""

from __future__ import annotations

from corecpu.distributed.shm_allreduce import KERNEL_LEVEL_BF16


def bf16_wire_as_expected(report: dict) -> bool:
    """gloo's bf16 wire always rounds as documented. The op's: summed alike where its kernels take bf16 (AVX-512,
    or no op at all on a 1-rank host), else refused with the one-line error naming --allreduce-dtype fp32."""
    level = report["kernel_level"]
    expected = "summed" if level is None or level >= KERNEL_LEVEL_BF16 else "refused"
    return report["gloo_bf16_wire"] and report["bf16_wire"] == expected
