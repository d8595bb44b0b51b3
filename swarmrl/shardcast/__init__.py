"""SHARDCAST: policy versions from the trainer to every node, over HTTP.

A version is a directory `step_NNNNNN/` with the Hugging Face files and a
signed `manifest.json`, written last (manifest.py, local.py). The weights
seam has two sides: the trainer publishes (`LocalWeights.staging_dir`,
`publish`), nodes find and open the newest complete version (`newest`,
`open_verified`). `LocalWeights` is both, over a shared directory
(`shardcast.enabled = false`). Over HTTP: the origin in the trainer
(origin.py) and relays (relay.py) serve versions with one server
(server.py); nodes and relays download them with the `Follower` client
(client.py, servers.py, fastget.py, writer.py); source.py picks a node's
source from the config; fetch.py is `swarmrl fetch`.
"""
