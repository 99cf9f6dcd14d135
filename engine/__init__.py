"""The certification engine: models, schedules, noise, backends, pipeline, certification math."""
