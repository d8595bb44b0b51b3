"""The weights seam: policy versions as directories with a manifest.

`WeightsSink` publishes a version, `WeightsSource` finds and opens the newest
complete one. `LocalWeights` is both, over a shared directory (the embedded
default); the SHARDCAST origin, relays and client (issue 3) implement the same
two interfaces over HTTP.
"""
