"""Commands that are not processes of a swarm: the tiny model's warm start
(`init-model`, init_model.py and warm_start.py), held-out evaluation (`eval`, evaluate.py),
solve-rate filtering (`filter`, filter.py), the configuration reference
(`config-docs`, config_docs.py) and the DiLoCo pre-training demo (pretrain/)."""
