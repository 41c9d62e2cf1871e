"""Memory per GPU: weights, gradients, optimizer state and activations per pipeline stage (`stages`), the GEMM
libraries' workspaces (`workspaces`), a precision recipe's quantised weight copies (`lowp_weights`) and the
activations PyTorch's split-backward schedules hold (`zero_bubble`). Rule: functions of the configuration and the
schedule's order, no cost."""
