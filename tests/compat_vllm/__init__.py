"""The vLLM compatibility suite: vLLM 0.33.0's tiering offload manager and tiers, on a CPU."""
