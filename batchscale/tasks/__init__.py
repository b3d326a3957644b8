"""Tasks beyond classification: each supplies model, batch, loss and metrics to the workloads."""
