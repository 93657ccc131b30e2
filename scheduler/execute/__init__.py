"""One way to run a job: the launch record (:mod:`~scheduler.execute.launch`), the executor interface
(:mod:`~scheduler.execute.api`), the progress channel (:mod:`~scheduler.execute.channel`), what a job's own process
does with its record (:mod:`~scheduler.execute.apply`), and one module per backend: a Ray actor
(:mod:`~scheduler.execute.ray_actor`), a local process group (:mod:`~scheduler.execute.local`), and this process, for
tests and debuggers (:mod:`~scheduler.execute.inprocess`).

The plan's driver (``scheduler.runtime``) and the slot service (``scheduler.service``) both hand a
:class:`~scheduler.execute.launch.LaunchRecord` to an executor's ``submit`` and read back the same events, the same
exit and the same :class:`jobs.JobOutput`, whatever the job's kind and wherever it runs. Between ``store`` (below)
and ``runtime`` (above): it may use ``core``, ``policy``, ``jobs`` and ``store``, never Ray's cluster start or the
run loop.
"""
