"""The results lake: publish, history, regression check and run summaries."""
