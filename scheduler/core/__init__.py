"""The plan's vocabulary: the schema, units, errors, hardware (the one NVML reader), job states, scoring."""
