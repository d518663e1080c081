"""The Ray cluster client: attempts as placement groups and runners, Ray jobs, warm pool, head watch."""
