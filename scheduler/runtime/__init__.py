"""Ray: the cluster, one actor per job, the driver, monitoring, telemetry and gauges, doctor."""
