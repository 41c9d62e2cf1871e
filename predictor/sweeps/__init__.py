"""Many predictions at once: the configuration search (`search`), its shards as Ray tasks (`ray_executor`), and the
calibration fit to measured iteration times (`calibration_fit`). Rule: drives `predictor.predict`; the top room."""
