"""sloscope: SLO tiers to physical causes for AI inference fleets."""
