"""The command line: the verbs, tables and live progress; nothing else lives here."""
