"""The commands that compose the stages: the CLI, serve, the demo, validate."""
