"""The CPU rehearsal's scale: what a timm job computes when CUDA is absent. The job (``jobs/timm_job``) runs at it and
the time model (``policy/timing/tasktime``) predicts at it, so both read these figures from here."""

IMAGE_SIZE = 32  # pixels a side, at most
BATCH_SIZE = 32  # images a step, at most (memory is simulated at the planned batch)
EPOCHS = 3  # at most
STEPS_PER_EPOCH = 25  # optimizer steps an epoch, at most; the validation fold and the test set are predicted in full


def threads(cpus: int, wave_cpus: int, physical: int) -> int:
    """Threads a task computes with in the rehearsal: this machine's ``physical`` cores shared out as the plan shares
    the card's node (a task holding ``cpus`` of its wave's ``wave_cpus``). The runner binds it into the launch
    record; the time model predicts with it."""
    return max(1, min(cpus or 1, round(physical * (cpus or 1) / max(1, wave_cpus))))
