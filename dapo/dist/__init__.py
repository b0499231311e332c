"""Processes: the process group and FSDP2 sharding of the policy (distributed), and preemption
(USR2 from Slurm: a checkpoint at the step boundary, or a requeue at once)."""
