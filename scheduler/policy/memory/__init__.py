"""How much memory a job takes, and the batch that fits: the GPU peak of a training step (``estimate``, with
``overhead``: what a process holds beyond its tensors), the images kept on the card (``inputs``), the host RAM of a
task (``hostmem``), the plan's batches fitted into the band (``fit``), and a running job's batch changes
(``autotune``)."""
