"""Notebook 08 on hpclab.ddp's MLP: ZeRO-1 (zero), a tensor-parallel layer (tensor), pipeline stages (pipeline)."""
