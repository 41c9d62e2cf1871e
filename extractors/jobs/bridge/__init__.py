"""Megatron-Bridge as its published rows name it: the model providers' architectures (`providers`), the recipe
presets' settings (`recipes`), their precision recipes (`precision`), what the performance launchers set
(`perf_launch`) and the Slurm segments its launcher places a job in on NVL72 (`segments`)."""
