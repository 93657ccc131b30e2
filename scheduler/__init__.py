import jobs  # noqa: F401 -- registers the job kinds (core.kinds) before any plan is read
