"""The run's memory, planned before the model loads (docs/architecture.md, issue 68).

budget.py: the bytes a run may use (`--max-memory`/`memory.max`, else the device's memory: a cgroup's
limit or physical memory on the CPU, the GPU's on CUDA), shared among torchrun's processes on one machine.
allocator.py: glibc's heap told to hand freed blocks back (`mallopt`), so a process's peak is its arrays.
plan.py and its parts: every phase's peak from the config, config.json and checkpoint sizes.
"""
