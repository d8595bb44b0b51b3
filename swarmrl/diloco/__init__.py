"""DiLoCo across trainer sites: this package is empty.

DiLoCo (several trainer sites with an outer optimizer and 8-bit
pseudo-gradients, ../shared/DESIGN.md) is planned; a run today has one
trainer, and nothing in swarmrl imports this package.
"""
