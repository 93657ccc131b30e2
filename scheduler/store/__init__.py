"""The run folder: its SQLite record and events, job outputs, the report, the competition's data."""
