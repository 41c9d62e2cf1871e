"""The iteration in time: each stage's work from a prepared graph (`stage_work`), Megatron-core's own costs around it
(`framework_costs`), activation offloading's copies (`activation_offload`), the expert-parallel overlap's exposed
passes (`ep_overlap`), the linears' backward collectives beside their GEMMs (`tp_overlap`), and the simulation of
Megatron's pipeline schedules (`pipeline`) and PyTorch's split-backward ones (`zero_bubble`). Rule: turns estimated
ops into a timeline; imports `ir`, `costs`, `parallel`, `assembly`."""
