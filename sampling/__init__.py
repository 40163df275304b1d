"""Adaptive trace sampling: the policy, the head sampler and the tail-sampling config."""
