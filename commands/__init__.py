"""The commands that compose the stages: the CLI, serve, the demo and the decode workers."""
