"""Which launcher started this process and what it says about the job: rank, world size, local
ranks, where rank 0 is, and the launcher's facts (MPI world, Slurm task), as small classes; the
TCP listeners a launcher leaves to its ranks (listeners); what each rank tells `corecpu launch`
through the job's directory (job_records); oneCCL's regions left in /dev/shm (ccl_shm).

May import: corecpu.errors, corecpu.envvars, corecpu.atomic. Torch-free, and never imports ray (a Ray Train worker's
context is read only where Ray has loaded ray.train).
"""
