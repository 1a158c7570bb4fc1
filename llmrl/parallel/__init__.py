"""Several processes: torch.distributed collectives (distributed.py), FSDP2 sharding (fsdp.py)."""
