"""gpupack: the system (``scheduler``) that packs and runs the training jobs (``jobs``). Importing it loads nothing
else: the job kinds' registry is filled when it is first asked (``scheduler.core.kinds.load``)."""
