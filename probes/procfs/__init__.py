"""procfs probes: no privilege needed. Each module has a pure parser (text -> numbers) and a probe."""
